"""Whether a launch resumes its run directory (the directory's one writer is `lerobot.runtime.lock`).

The resume decision (`training.resume`): `auto` resumes from `checkpoints/last` when the directory holds one
and starts fresh otherwise, so relaunching the same command after a preemption continues the run; `true`
requires a checkpoint; `false` refuses a directory that holds one. A resumed run must have the config it was
started with, except for the keys of `RESUMABLE_CHANGES`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.checkpoints.run import latest_checkpoint, load_config
from lerobot.errors import RunDirError

log = logging.getLogger(__name__)

# Keys that may differ between a checkpoint's config and the launch that resumes it (a prefix ending in "."
# stands for the whole section): the step budget (extending a run; the LR schedule of the remaining steps
# then follows the new total), how often to log/save/evaluate and how evaluation runs, logging, the device,
# data loading workers, where the run and its data live, and the evaluation-only inference layer. Everything
# else shapes the trajectory of training, so a change there is a different run.
RESUMABLE_CHANGES = (
    "training.steps",
    "training.resume",
    "training.log_freq",
    "training.save_freq",
    "training.num_workers",
    "training.save_buffer",
    "training.use_async_envs",
    "training.compile",
    "eval.",
    "wandb.",
    "device",
    "output_dir",
    "job_name",
    "dataset.root",
    "dataset.cache_dir",
    "inference.",
)


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The checkpoint this launch continues from (None: a fresh run), per `training.resume`.

    Raises `RunDirError` when the checkpoint's config differs from `cfg` in a key outside
    `RESUMABLE_CHANGES`, and when `resume` is `true` without a checkpoint or `false` with one.
    """
    mode = str(cfg.training.resume)
    last = latest_checkpoint(run_dir)
    if mode == "false":
        if last is not None:
            raise RunDirError(
                f"{run_dir} already holds checkpoints and training.resume=false; pass training.resume=auto "
                "to continue it or pick another output_dir"
            )
        return None
    if last is None:
        if mode == "true":
            raise RunDirError(f"training.resume=true but {run_dir} holds no checkpoint (checkpoints/last)")
        return None
    changed = config_changes(load_config(last), cfg)
    if changed:
        shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise RunDirError(
            f"{run_dir} holds a run with another config: {shown}{more}; relaunch with the run's settings "
            "to resume it, or pick another output_dir for a new run"
        )
    return last


def config_changes(saved: DictConfig, current: DictConfig) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for every dotted key whose value differs, outside `RESUMABLE_CHANGES`."""
    a = _flatten(OmegaConf.to_container(saved, resolve=True))
    b = _flatten(OmegaConf.to_container(current, resolve=True))
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not _resumable(k)]


def _resumable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as `{dotted.key: leaf}`; lists are leaves (compared whole)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, dict) and v else f"{prefix}{k}"))
    return out
