"""Checkpoints: a directory per step, written atomically, loadable without any dataset.

Layout of `run_dir/checkpoints/000001000/`:
- `model.safetensors`: the weights to evaluate (the EMA weights when the policy trains with EMA), including
  normalization statistics, which live in buffers.
- `config.yaml`: the fully resolved config of the run (env, policy, training, eval).
- `training_state.pt` (optional): raw weights, optimizer, LR scheduler, EMA, RNG states, step, extras.
`run_dir/checkpoints/last` is a symlink to the newest complete checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file

from lerobot.config import env_config, validate_config
from lerobot.policies.factory import available_policies, make_policy, make_policy_config, policy_config_class
from lerobot.policies.policy import Policy

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
TRAINING_STATE_FILE = "training_state.pt"
CHECKPOINTS_DIR = "checkpoints"
LAST_LINK = "last"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not fit the policy/env it is loaded into."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives in `run_dir`."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"{step:09d}"


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: Policy,
    cfg: DictConfig,
    training_state: dict[str, Any] | None = None,
    eval_state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint for `step` atomically and point `last` at it; return its directory.

    `eval_state_dict` replaces the policy's own weights in `model.safetensors` (e.g. EMA weights).
    Everything is written into a temporary sibling directory that is renamed only when complete, so a
    crash never leaves a directory that looks like a checkpoint.
    """
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{step:09d}-"))
    try:
        state = eval_state_dict if eval_state_dict is not None else policy.state_dict()
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp / MODEL_FILE)
        OmegaConf.save(cfg, tmp / CONFIG_FILE, resolve=True)
        if training_state is not None:
            torch.save(training_state, tmp / TRAINING_STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    link = final.parent / LAST_LINK
    tmp_link = final.parent / f".{LAST_LINK}.tmp"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(final.name)
    os.replace(tmp_link, link)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `last` points at, or None when the run has none."""
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    if link.exists():
        return link.resolve()
    return None


def resolve_checkpoint_dir(path: Path | str) -> Path:
    """Accept a checkpoint directory, a `checkpoints/` folder or a run directory; return the checkpoint."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if (path / MODEL_FILE).exists() or (path / CONFIG_FILE).exists():
        return path
    for candidate in (path / LAST_LINK, path / CHECKPOINTS_DIR / LAST_LINK):
        if candidate.exists():
            return candidate.resolve()
    raise CheckpointError(f"{path} is not a checkpoint: it holds no {MODEL_FILE} and no checkpoints/last")


def load_config(ckpt_dir: Path) -> DictConfig:
    """The validated run config stored in a checkpoint."""
    path = Path(ckpt_dir) / CONFIG_FILE
    if not path.exists():
        raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: {CONFIG_FILE} is missing")
    try:
        cfg = OmegaConf.load(path)
        name = OmegaConf.select(cfg, "policy.name")
        if name in available_policies():  # keys an older version saved, in today's places
            policy_config_class(name).upgrade_saved(cfg.policy)
        return validate_config(cfg)
    except Exception as e:
        raise CheckpointError(f"{path} is not a valid config: {e}") from None


def load_policy(ckpt_dir: Path | str, device: str | torch.device = "cpu", cfg: DictConfig | None = None):
    """Rebuild the policy of a checkpoint from its config and weights; return `(policy, cfg)`.

    `cfg` (optional) replaces the stored config, e.g. with evaluation overrides applied.
    """
    ckpt_dir = resolve_checkpoint_dir(ckpt_dir)
    cfg = load_config(ckpt_dir) if cfg is None else cfg
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    policy = make_policy(policy_cfg)
    weights = ckpt_dir / MODEL_FILE
    if not weights.exists():
        raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: {MODEL_FILE} is missing")
    try:
        state = load_file(weights)
    except Exception as e:  # safetensors raises several types for corrupt files
        raise CheckpointError(
            f"{weights} is corrupt or truncated ({e}); re-save or pick another checkpoint"
        ) from None
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match policy {policy_cfg.name!r}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return policy.to(device), cfg


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    """The optimizer/scheduler/EMA/RNG/step state saved next to the weights."""
    path = Path(ckpt_dir) / TRAINING_STATE_FILE
    if not path.exists():
        raise CheckpointError(f"cannot resume from {ckpt_dir}: {TRAINING_STATE_FILE} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(f"{path} is corrupt ({e})") from None


def get_rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) random states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
