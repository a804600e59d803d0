"""A run checkpoint read back (the layout: `run_layout`): its config (`load_config`), weights
(`read_weights`), training state (`load_training_state`), data fingerprint and the policy rebuilt from them
(`load_run_policy`), each file verified against the checkpoint's checksums before it is read, without any
dataset.

A checkpoint saved with checksums whose `checksums.json` is gone is refused; one of an older version (its
weights record no checksums) is read unverified, with a warning. Weights that are not finite are refused
(`raise_if_non_finite`, which the writer applies too: `run_writer`), and every error names the run's other
checkpoints to use instead (`other_checkpoints_hint`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import safe_open
from torch import nn

from lerobot.checkpoints.run_layout import (
    CONFIG_FILE,
    DATA_FINGERPRINT_FILE,
    MODEL_FILE,
    Meta,
    other_checkpoints_hint,
    resolve_checkpoint_dir,
)
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE, safe_load_state
from lerobot.config import config_differences, env_config, policy_config, policy_section, upgrade_saved_config
from lerobot.errors import CheckpointError, ChecksumError, NonFiniteWeightsError
from lerobot.policy_registry import available_policies, make_policy, policy_config_class, validate_run_config
from lerobot.runtime.checksums import CHECKSUMS_FILE, verify_checksum

log = logging.getLogger(__name__)


def _require_checksums(ckpt_dir: Path) -> None:
    """Raise `CheckpointError` when `checksums.json` is missing from a checkpoint whose weights record that
    it was saved with one; a checkpoint of an older version (no such record) is read unverified, with a
    warning."""
    ckpt_dir = Path(ckpt_dir)
    if (ckpt_dir / CHECKSUMS_FILE).exists() or not _records_checksums(ckpt_dir):
        return
    raise CheckpointError(
        f"checkpoint {ckpt_dir} was saved with checksums but {ckpt_dir / CHECKSUMS_FILE} is missing, so its "
        "files cannot be verified: restore that file (copy the checkpoint directory again, whole), or, if "
        'you trust the files as they are, record new checksums with `python -c "from '
        f"lerobot.runtime.checksums import write_checksums; write_checksums('{ckpt_dir}')\"`; "
        f"{other_checkpoints_hint(ckpt_dir)}"
    )


def _records_checksums(ckpt_dir: Path) -> bool:
    """Whether the weights' header says the checkpoint was saved with `checksums.json`."""
    path = Path(ckpt_dir) / MODEL_FILE
    if not path.is_file():
        return False
    try:
        with safe_open(path, framework="pt") as f:
            return Meta.CHECKSUMS in (f.metadata() or {})
    except Exception:  # a corrupt header: reading the weights reports it
        return False


def _verified(ckpt_dir: Path, name: str) -> Path:
    """`ckpt_dir/name`, after checking it against the checkpoint's checksums (a `CheckpointError` if not)."""
    path = Path(ckpt_dir) / name
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {ckpt_dir} is incomplete: {name} is missing; {other_checkpoints_hint(ckpt_dir)}"
        )
    _require_checksums(ckpt_dir)
    try:
        verify_checksum(ckpt_dir, name)
    except ChecksumError as e:
        raise CheckpointError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return path


def load_config(ckpt_dir: Path) -> DictConfig:
    """The validated run config stored in a checkpoint.

    A `config.yaml` that differs from its saved checksum but is still a valid config was edited on purpose:
    that is only a warning (the weights' own record then catches a changed architecture or feature).
    """
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / CONFIG_FILE
    if not path.exists():
        raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: {CONFIG_FILE} is missing")
    _require_checksums(ckpt_dir)
    try:
        verify_checksum(ckpt_dir, CONFIG_FILE)
        changed = None
    except ChecksumError as e:
        changed = str(e)
    try:
        cfg = OmegaConf.load(path)
        if not isinstance(cfg, DictConfig) or "env" not in cfg or "policy" not in cfg:
            kind = "empty" if not path.read_text().strip() else "corrupt (no env and policy sections)"
            raise CheckpointError(f"{path} is {kind}: the checkpoint's config is lost")
        # Keys an older version saved, in today's places: the inference settings (once under `policy`), then
        # the policy's own.
        upgrade_saved_config(cfg)
        name = OmegaConf.select(cfg, "policy.name")
        if name in available_policies():
            policy_config_class(name).upgrade_saved(cfg.policy)
        cfg = validate_run_config(cfg)
    except Exception as e:
        reason = str(e) if isinstance(e, CheckpointError) else f"{path} is not a valid config: {e}"
        if changed is not None and not isinstance(e, CheckpointError):
            reason = f"{reason} ({changed})"
        raise CheckpointError(f"{reason}; {other_checkpoints_hint(ckpt_dir)}") from None
    if changed is not None:
        log.warning("%s was modified after it was saved (%s)", path, changed)
    return cfg


def read_weights(ckpt_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The verified, finite weights of a checkpoint and their header metadata (empty for older checkpoints)."""
    path = _verified(ckpt_dir, MODEL_FILE)
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except Exception as e:  # safetensors raises several types for corrupt files
        raise CheckpointError(
            f"{path} is corrupt or truncated ({e}); {other_checkpoints_hint(ckpt_dir)}"
        ) from None
    try:
        raise_if_non_finite(state, f"the weights in {path} (saved by a run that had diverged)")
    except NonFiniteWeightsError as e:
        raise NonFiniteWeightsError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return state, metadata


def weights_metadata(ckpt_dir: Path) -> dict[str, str]:
    """The header metadata of a checkpoint's weights (without reading the tensors); {} when it has none."""
    path = Path(ckpt_dir) / MODEL_FILE
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:
        raise CheckpointError(
            f"{path} is corrupt or truncated ({e}); {other_checkpoints_hint(ckpt_dir)}"
        ) from None


def check_features(ckpt_dir: Path, cfg: DictConfig) -> None:
    """Raise `CheckpointError` naming the first feature whose shape differs between what the checkpoint's
    weights were trained with and what the env of `cfg` provides (or that only one side has)."""
    ckpt_dir = Path(ckpt_dir)
    meta = weights_metadata(ckpt_dir) if (ckpt_dir / MODEL_FILE).exists() else {}
    if Meta.FEATURES in meta:
        want, trained_env = json.loads(meta[Meta.FEATURES]), meta.get(Meta.ENV, "?")
    else:  # saved before the weights recorded their features: the config is the record
        trained = load_config(ckpt_dir)
        want = {k: list(v.shape) for k, v in env_config(trained).features.items()}
        trained_env = trained.env.name
    env = env_config(cfg)
    have = {k: list(v.shape) for k, v in env.features.items()}
    problems = []
    for key in sorted(want.keys() | have.keys()):
        if key not in have:
            problems.append(f"the checkpoint needs feature {key!r} {want[key]}, which env {env.name!r} lacks")
        elif key not in want:
            problems.append(f"env {env.name!r} gives feature {key!r} {have[key]}, which the checkpoint lacks")
        elif want[key] != have[key]:
            problems.append(
                f"feature {key!r} has shape {want[key]} in the checkpoint but {have[key]} in env {env.name!r}"
            )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"{problems[0]}{more}; evaluate it on the env it was trained on (env={trained_env}, with the "
            "observation size it was trained with)"
        )


def load_run_policy(
    ckpt_dir: Path | str, device: str | torch.device = "cpu", cfg: DictConfig | None = None
) -> tuple[nn.Module, DictConfig]:
    """Rebuild the policy of a checkpoint from its config and weights; return `(policy, cfg)`.

    `cfg` (optional) replaces the stored config, e.g. with evaluation overrides applied. The weights are
    verified against their checksum and must be finite; a policy config whose architecture differs from
    the one the weights were trained with is refused, naming the differing fields and shapes.
    """
    ckpt_dir = resolve_checkpoint_dir(ckpt_dir)
    cfg = load_config(ckpt_dir) if cfg is None else cfg
    policy_cfg = policy_config(cfg)
    policy = make_policy(policy_cfg)
    state, metadata = read_weights(ckpt_dir)
    weights = ckpt_dir / MODEL_FILE
    own = policy.state_dict()
    differ = [
        (k, tuple(state[k].shape), tuple(v.shape))
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if differ:
        saved = json.loads(metadata[Meta.POLICY]) if Meta.POLICY in metadata else None
        if saved is None:  # older checkpoint: compare with its config.yaml (catches command-line overrides)
            saved = policy_section(load_config(ckpt_dir))
        fields = config_differences(saved, policy_section(cfg), prefix="policy.")
        named = "; ".join(f"{k}={b} but the weights were trained with {a}" for k, a, b in fields[:3])
        key, a, b = differ[0]
        raise CheckpointError(
            f"{weights} does not fit the configured policy ({named or 'its architecture differs'}): "
            f"{len(differ)} tensors differ in shape, e.g. {key} is {list(a)} in the checkpoint and {list(b)} "
            "in the model; drop the override (or restore config.yaml)"
        )
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match policy {policy_cfg.name!r}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return policy.to(device), cfg


def read_data_fingerprint(ckpt_dir: Path) -> dict[str, Any] | None:
    """The fingerprint of the data the checkpoint was trained on, verified; None when it records none (a
    checkpoint of a run without a dataset, or saved before checkpoints recorded one)."""
    if not (Path(ckpt_dir) / DATA_FINGERPRINT_FILE).exists():
        return None
    path = _verified(ckpt_dir, DATA_FINGERPRINT_FILE)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is corrupt ({e}); {other_checkpoints_hint(ckpt_dir)}") from None


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    """The optimizer/scheduler/EMA/RNG/step state saved next to the weights, verified and checked finite.

    It is read with `torch.load(weights_only=True)`: tensors and plain containers only, so a crafted file
    cannot run code (`safe_load_state`).
    """
    path = Path(ckpt_dir) / TRAINING_STATE_FILE
    if not path.exists():
        raise CheckpointError(f"cannot resume from {ckpt_dir}: {TRAINING_STATE_FILE} is missing")
    _verified(ckpt_dir, TRAINING_STATE_FILE)
    state = safe_load_state(path, other_checkpoints_hint(ckpt_dir))
    weights = dict(state.get("model") or {})
    ema = state.get("ema") or {}
    weights.update({f"ema.shadow_params.{i}": t for i, t in enumerate(ema.get("shadow_params", []))})
    try:
        raise_if_non_finite(weights, f"the weights in {path} (saved by a run that had diverged)")
    except NonFiniteWeightsError as e:
        raise NonFiniteWeightsError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return state


def raw_weights(ckpt_dir: Path | str) -> dict[str, torch.Tensor]:
    """The optimizer's own weights of a checkpoint trained with EMA (`policy.use_ema=true`), whose
    `model.safetensors` holds the averaged ones: to evaluate what EMA changes on the same run.

    Raises `CheckpointError` when the checkpoint keeps no training state or was trained without EMA (its
    `model.safetensors` is then the raw weights already).
    """
    ckpt_dir = resolve_checkpoint_dir(ckpt_dir)
    if not (ckpt_dir / TRAINING_STATE_FILE).exists():
        raise CheckpointError(
            f"{ckpt_dir} keeps no {TRAINING_STATE_FILE}, so no raw weights: evaluate it without --raw-weights"
        )
    state = load_training_state(ckpt_dir)
    if state.get("ema") is None or state.get("model") is None:
        raise CheckpointError(
            f"{ckpt_dir} was trained without EMA: its {MODEL_FILE} holds the raw weights already; "
            "drop --raw-weights"
        )
    return state["model"]


def raise_if_non_finite(state: dict[str, torch.Tensor], what: str) -> None:
    """Raise `NonFiniteWeightsError` naming the first floating tensor of `state` with a NaN or inf."""
    floats = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not floats:
        return
    # One reduction and one host sync for the whole state dict, not one per tensor.
    flags = torch.stack([torch.isfinite(v).all() for v in floats.values()])
    if bool(flags.all()):
        return
    key = list(floats)[int((~flags).nonzero()[0])]
    bad = floats[key][~torch.isfinite(floats[key])]
    raise NonFiniteWeightsError(
        f"{what} are not finite ({key} holds {bad.numel()} values like {bad[0].item()})"
    )
