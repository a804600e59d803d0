"""Whether a launch resumes its run directory, branches from another run's checkpoint or starts fresh, and
what a resumed run must keep.

The resume decision (`training.resume`, `resume_checkpoint`): `auto` resumes from `checkpoints/last` when the
directory holds one and starts fresh otherwise, so relaunching the same command after a preemption continues
the run; `true` requires a checkpoint; `false` refuses a directory that holds one. A resumed run must have the
config it was started with, except for the keys of `RESUMABLE_CHANGES`, and the data it was trained on
(`check_training_data`), unless `training.allow_other_data=true`. A new run may start from another run's
checkpoint under a changed config (`training.init_from`, `branch_checkpoint`): a branch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.checkpoints.run import load_config, read_data_fingerprint
from lerobot.checkpoints.run_layout import latest_checkpoint, resolve_checkpoint_dir
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE
from lerobot.config import config_differences
from lerobot.errors import CheckpointError, RunDirError

log = logging.getLogger(__name__)

# Keys that may differ between a checkpoint's config and the launch that resumes it (a prefix ending in "."
# stands for the whole section): the step budget (extending a run; the LR schedule of the remaining steps then
# follows the new total), how often to log/save/evaluate and how evaluation runs, logging, the device, how
# long processes wait for each other, data loading workers, where the run and its data live (the data itself
# is compared by its fingerprint, `check_training_data`, which `training.allow_other_data` waives), and the
# evaluation-only inference layer. Everything else shapes the trajectory of training, so a change there is a
# different run.
RESUMABLE_CHANGES = (
    "training.steps",
    "training.resume",
    "training.log_freq",
    "training.save_freq",
    "training.num_workers",
    "training.save_buffer",
    "training.use_async_envs",
    "training.compile",
    "training.collective_timeout_s",
    "training.allow_other_data",
    "training.keep_checkpoints",
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
        return branch_checkpoint(cfg)
    changed = config_changes(load_config(last), cfg)
    if changed:
        raise RunDirError(
            f"{run_dir} holds a run with another config: {summarize_changes(changed)}; relaunch with the "
            "run's settings to resume it, or pick another output_dir for a new run"
        )
    return last


def branch_checkpoint(cfg: DictConfig) -> Path | None:
    """The checkpoint a new run starts from (`training.init_from`: a run directory, for its last checkpoint,
    or one checkpoint directory); None when it is not set.

    The new run's config may differ from the checkpoint's in anything but the model's shape (the weights
    must load, `TrainStep.load_state_dict`); the differences are logged. Raises `RunDirError` when the path
    holds no checkpoint.
    """
    if cfg.training.init_from is None:
        return None
    source = cfg.training.init_from
    try:
        ckpt = resolve_checkpoint_dir(source)
        reason = None if (ckpt / TRAINING_STATE_FILE).is_file() else f"{ckpt} holds no {TRAINING_STATE_FILE}"
    except CheckpointError as e:
        reason = str(e)
    if reason is not None:
        raise RunDirError(
            f"training.init_from={source} is neither a run directory with a checkpoint nor a checkpoint "
            f"directory ({reason}); point it at the run or training checkpoint to start from"
        )
    changed = [c for c in config_changes(load_config(ckpt), cfg) if c[0] != "training.init_from"]
    log.info("branching from %s; config changes: %s", ckpt, describe_changes(changed) or "none")
    return ckpt


def config_changes(saved: DictConfig, current: DictConfig) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for every dotted key whose value differs, outside `RESUMABLE_CHANGES`."""
    changed = config_differences(
        OmegaConf.to_container(saved, resolve=True), OmegaConf.to_container(current, resolve=True)
    )
    return [c for c in changed if not _resumable(c[0])]


def _resumable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)


def describe_changes(changed: list[tuple[str, Any, Any]]) -> str:
    """`config_changes` output as one line: `key (saved -> current), ...`."""
    return ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in changed)


# A changed `<section>.name` (another env, another policy) is said as `env changed: a -> b`, without the keys
# that come with it: the section's own, and for an env, the features the policy takes from it.
_NAMED_SECTIONS = {
    "env": ("env.", "policy.input_features.", "policy.output_features."),
    "policy": ("policy.",),
}


def summarize_changes(changed: list[tuple[str, Any, Any]], shown: int = 5) -> str:
    """`config_changes` output as one short line: another env or policy as `env changed: pusht ->
    pusht_keypoints`, then up to `shown` other keys as `key (saved -> current)` and how many more."""
    names = {k: (a, b) for k, a, b in changed if k.endswith(".name")}
    heads, rest = [], list(changed)
    for section, follow in _NAMED_SECTIONS.items():
        if f"{section}.name" in names:
            heads.append(f"{section} changed: {names[f'{section}.name'][0]} -> {names[f'{section}.name'][1]}")
            rest = [c for c in rest if not c[0].startswith(follow)]
    more = f" and {len(rest) - shown} more" if len(rest) > shown else ""
    return ", ".join([*heads, *([describe_changes(rest[:shown]) + more] if rest else [])])


# The fields of a data fingerprint (`lerobot.datasets.dataset_fingerprint`) that tell one dataset from
# another; `source` (where it was read) only helps the message: the same data moved elsewhere is the same.
FINGERPRINT_KEYS = ("format", "episodes", "frames", "sha256")


def check_training_data(ckpt_dir: Path, current: dict[str, Any] | None, cfg: DictConfig) -> None:
    """Raise `RunDirError` when the run resumed from `ckpt_dir` was trained on other data than `current`.

    `current` is the fingerprint of the data this launch reads (None: it reads none). A checkpoint that
    records no fingerprint (saved before checkpoints recorded one) resumes as before, unchecked. With
    `training.allow_other_data=true` a mismatch is a warning and the run goes on with the new data (and the
    checkpoint's normalization statistics); its next checkpoints record the new fingerprint.
    """
    if current is None:
        return
    saved = read_data_fingerprint(ckpt_dir)
    if saved is None:
        log.info(
            "%s records no fingerprint of its training data (an older checkpoint): not compared", ckpt_dir
        )
        return
    if all(saved.get(k) == current.get(k) for k in FINGERPRINT_KEYS):
        return
    run_dir = Path(ckpt_dir).parent.parent
    both = (
        f"checkpoint {Path(ckpt_dir).name} was trained on {describe_data(saved)}, "
        f"this launch reads {describe_data(current)}"
    )
    if cfg.training.allow_other_data:
        log.warning("resuming %s on other data (training.allow_other_data=true): %s", run_dir, both)
        return
    raise RunDirError(
        f"{run_dir} holds a run trained on other data: {both}; point dataset.root (or dataset.repo_id) at "
        "the run's data to resume it, pass training.allow_other_data=true to go on with this data (keeping "
        "the checkpoint's normalization statistics), or pick another output_dir for a new run"
    )


def describe_data(fingerprint: dict[str, Any]) -> str:
    """A fingerprint in words: `206 episodes, 25650 frames (pusht_zarr, sha256 1a2b3c4d5e6f) from PATH`."""
    return (
        f"{fingerprint.get('episodes')} episodes, {fingerprint.get('frames')} frames "
        f"({fingerprint.get('format')}, sha256 {str(fingerprint.get('sha256'))[:12]}) "
        f"from {fingerprint.get('source', '?')}"
    )
