"""Pieces both trainers and `scripts/eval.py` share: run directory, device, seeding, evaluation."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lerobot.config import ConfigError, env_config
from lerobot.envs import make_env, resolve_use_async
from lerobot.policies.factory import inference_context
from lerobot.policies.policy import Policy
from lerobot.rollout import eval_policy
from lerobot.training.checkpoint import remove_stale_temporaries
from lerobot.training.run_dir import lock_run_dir, release_run_dir, resume_checkpoint

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is a config error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA GPU is available; use device=cpu")
    return torch.device(name)


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_run(cfg: DictConfig) -> tuple[Path, Path | None]:
    """Create (or find) the run directory and lock it; return it and the checkpoint to resume from, if any.

    Without `output_dir` a new, timestamped directory is made (so nothing is resumed automatically). The
    lock (`lerobot.training.run_dir`) is taken before anything is read or written (stale checkpoint
    temporaries are cleared under it), and released when `lerobot.training.train` returns; `training.resume`
    decides between resuming and a fresh start.
    """
    if cfg.output_dir is None:
        if cfg.training.resume == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        now = dt.datetime.now()
        cfg.output_dir = str(
            Path("outputs/train")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{cfg.env.name}_{cfg.policy.name}"
        )
    run_dir = Path(cfg.output_dir)
    lock_run_dir(run_dir)
    try:
        remove_stale_temporaries(
            run_dir
        )  # before looking for checkpoints: a complete one may be put in place
        resume_from = resume_checkpoint(cfg, run_dir)
    except BaseException:
        release_run_dir(run_dir)
        raise
    log.info(
        "run directory: %s (%s)", run_dir, f"resuming from {resume_from.name}" if resume_from else "new run"
    )
    return run_dir, resume_from


def evaluate(cfg: DictConfig, policy: Policy, out_dir: Path, progress: bool = False) -> dict[str, Any]:
    """Run `eval_policy` with the `eval` settings of `cfg`; write `out_dir/eval_info.json` and videos.

    The env count is `min(eval.batch_size, eval.n_episodes)`, sync or async per `eval.use_async_envs`.
    """
    env_cfg = env_config(cfg)
    n_envs = min(cfg.eval.batch_size, cfg.eval.n_episodes)
    use_async = resolve_use_async(cfg.eval.use_async_envs, env_cfg, n_envs)
    log.info(
        "evaluating %s on %s: %d episodes, %d %s envs",
        cfg.policy.name,
        env_cfg.name,
        cfg.eval.n_episodes,
        n_envs,
        "async" if use_async else "sync",
    )
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        # The policy's registered inference layer (e.g. Diffusion's CPU fast path), if its config enables it,
        # built from the policy in eval mode.
        policy.eval()
        with inference_context(policy):
            info = eval_policy(
                env,
                policy,
                cfg.eval.n_episodes,
                start_seed=cfg.eval.start_seed,
                max_episodes_rendered=cfg.eval.max_episodes_rendered,
                videos_dir=Path(out_dir) / "videos",
                progress=progress,
                step_timeout_s=cfg.eval.step_timeout_s,
                schedule=cfg.eval.schedule,
            )
    finally:
        env.close()
    info["config"] = OmegaConf.to_container(cfg, resolve=True)
    write_json(Path(out_dir) / "eval_info.json", info)
    return info


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
