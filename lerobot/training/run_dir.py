"""A launch's run directory: made (or found) and locked (`lerobot.runtime.files`), and whether it resumes.

The resume decision (`training.resume`): `auto` resumes from `checkpoints/last` when the directory holds one
and starts fresh otherwise, so relaunching the same command after a preemption continues the run; `true`
requires a checkpoint; `false` refuses a directory that holds one. A resumed run must have the config it was
started with, except for the keys of `RESUMABLE_CHANGES`, and the data it was trained on
(`check_training_data`), unless `training.allow_other_data=true`.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from types import TracebackType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.checkpoints.run import (
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    load_config,
    read_data_fingerprint,
    remove_stale_temporaries,
    set_last,
)
from lerobot.errors import ConfigError, NonFiniteWeightsError, RunDirError, TrainingDivergedError
from lerobot.runtime.files import lock_run_dir, release_run_dir

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


def setup_run(cfg: DictConfig) -> tuple[Path, Path | None]:
    """Create (or find) the run directory and lock it; return it and the checkpoint to resume from, if any.

    Without `output_dir` a new, timestamped directory is made (so nothing is resumed automatically). The
    lock (`lerobot.runtime.files`) is taken before anything is read or written (stale checkpoint
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
        # Before looking for checkpoints: a complete temporary may be put in place.
        remove_stale_temporaries(run_dir)
        resume_from = resume_checkpoint(cfg, run_dir)
    except BaseException:
        release_run_dir(run_dir)
        raise
    log.info(
        "run directory: %s (%s)", run_dir, f"resuming from {resume_from.name}" if resume_from else "new run"
    )
    return run_dir, resume_from


class DivergenceGuard:
    """Context manager around a trainer's loop that turns a diverged loss or non-finite weights into one
    `TrainingDivergedError` naming the last good checkpoint (and moving `last` back to it when needed).

    The trainer calls `updated()` after each gradient update and `saved(step)` after each checkpoint.
    """

    def __init__(self, run_dir: Path, advice: str):
        """`advice`: what to change before training again (see `TrainStep.advice`)."""
        self.run_dir = Path(run_dir)
        self.advice = advice
        self.updates = 0  # gradient updates made in this process
        self._saved: tuple[int, int] | None = None  # (step, updates made before it) of the last checkpoint

    def updated(self) -> None:
        """The weights changed."""
        self.updates += 1

    def saved(self, step: int) -> None:
        """Checkpoint `step` now holds the current weights."""
        self._saved = (step, self.updates)

    def _diverged_step(self, exc: BaseException) -> int | None:
        """The checkpoint step holding the weights that diverged, if they were saved."""
        if self._saved is None:
            return None
        # A non-finite loss at update n came from the weights after update n - 1; weights that cannot be
        # saved (non-finite) are the current ones.
        known = exc.update if isinstance(exc, TrainingDivergedError) else None
        weights_after = known - 1 if known is not None else self.updates
        step, updates_before = self._saved
        return step if updates_before == weights_after else None

    def __enter__(self) -> DivergenceGuard:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, TrainingDivergedError | NonFiniteWeightsError):
            message = f"{exc}; {self._keep_last_good(self._diverged_step(exc))}; {self.advice}"
            raise TrainingDivergedError(message) from None

    def _keep_last_good(self, diverged_step: int | None) -> str:
        """Point `last` at the newest checkpoint not holding the weights that diverged; say which it is."""
        bad = checkpoint_dir(self.run_dir, diverged_step) if diverged_step is not None else None
        good = [p for p in list_checkpoints(self.run_dir) if p != bad]
        if bad is not None and bad.exists():
            if not good:
                return f"checkpoint {bad} holds the weights that gave it and no earlier checkpoint exists"
            set_last(self.run_dir, good[-1])
            return (
                f"checkpoint {bad.name} holds the weights that gave it, so checkpoints/last now points at the "
                f"last good checkpoint, {good[-1]}"
            )
        if good:
            return f"the last good checkpoint is {good[-1]} (checkpoints/last)"
        return "no checkpoint was saved before"
