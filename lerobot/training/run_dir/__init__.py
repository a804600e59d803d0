"""A training run's directory, one room: made or found, locked for the launch, resumed or branched, saved
into, and cleared of what it does not keep. A trainer calls it in this order:

    with open_run_dir(cfg) as run_dir:        # open: made or found, locked, resume or branch decided
        resume_from = run_dir.resume(data)    # the checkpoint to restore (its data checked), or None
        ...                                   # restore, train
        run_dir.save(step, policy, state)     # a checkpoint, and `last` moved to it
    # close: the lock is released however the block ends

- `lock`: one writer per run directory (`RunLock`), checked again before every save.
- `resume`: resume, branch or a fresh start (`training.resume`, `training.init_from`), and what a resumed run
  must keep: its config but `RESUMABLE_CHANGES`, and its data (`check_training_data`).
- `saving`: a checkpoint saved by the owner only (`save_checkpoint`), and `checkpoints/last`, which never
  moves back but to the last good checkpoint of a diverged run (`set_last`).
- `cleanup`: what killed saves left (`remove_stale_temporaries`), what is not a checkpoint where one belongs
  (`set_aside_strays`), the checkpoints the run no longer keeps (`prune_checkpoints`).

One checkpoint's format (its files, how it is written atomically, verified and read) is
`lerobot.checkpoints`', and so is finding a run's latest complete checkpoint
(`lerobot.checkpoints.run_layout.latest_checkpoint`): it only reads, and loading and evaluation, a floor
below training, need it to resolve a run directory to its checkpoint.

A launch that fails before it has written anything of the run (no data, a bad checkpoint to branch from, a
Ctrl-C during the data conversion) leaves nothing behind: the directories it made are removed again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import nn

from lerobot import distributed
from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.errors import ConfigError
from lerobot.training.metrics import CURVES_FILE, METRICS_FILE
from lerobot.training.run_dir.cleanup import remove_stale_temporaries, set_aside_strays
from lerobot.training.run_dir.lock import LOCK_FILE, RunLock
from lerobot.training.run_dir.resume import check_training_data, resume_checkpoint
from lerobot.training.run_dir.saving import save_checkpoint

log = logging.getLogger(__name__)


@dataclass
class RunDir:
    """A training run's directory as this launch holds it (`open_run_dir`): where it is, the run's config, the
    checkpoint the launch continues from (None: a fresh start) and, on the main process, its lock."""

    path: Path
    cfg: DictConfig
    resume_from: Path | None
    lock: RunLock | None = None

    def resume(self, data: dict[str, Any] | None) -> Path | None:
        """The checkpoint to restore (None: a fresh start), once checked that it was trained on `data`, the
        fingerprint of the data this launch reads (`check_training_data`; None: it reads none)."""
        if self.resume_from is not None:
            check_training_data(self.resume_from, data, self.cfg)
        return self.resume_from

    def save(self, step: int, policy: nn.Module, **content: Any) -> Path:
        """Checkpoint `step` of the run with the run's config (`content`: `checkpoint_files`' other keyword
        arguments: the training state, EMA weights, data fingerprint), once checked that this launch still
        owns the directory; return the checkpoint's directory."""
        return save_checkpoint(self.path, checkpoint_files(step, policy, self.cfg, **content), self.lock)


@contextlib.contextmanager
def open_run_dir(cfg: DictConfig) -> Iterator[RunDir]:
    """The run directory, owned by this launch until the block ends, with the checkpoint it continues from;
    every process gets it, the main one makes, locks and reads the directory (and holds the lock).

    Without `output_dir` a new, timestamped directory is made (so nothing is resumed automatically) and
    `cfg.output_dir` names it. The lock (`RunLock`) is taken before anything is read or written (stale
    checkpoint temporaries are cleared, and files put where checkpoints were set aside, under it) and
    released when the block ends, however it ends; `training.resume` decides between resuming and a fresh
    start (`resume_checkpoint`). When the block ends by an exception before anything of the run was written,
    what this launch made is removed (`_undo_start`).
    """
    with contextlib.ExitStack() as owned:
        lock: RunLock | None = None

        def claim() -> tuple[Path, Path | None]:
            nonlocal lock
            run_dir = _name_run_dir(cfg)
            made = _missing_dirs(run_dir)
            before = set(os.listdir(run_dir)) if run_dir.is_dir() else set()
            lock = owned.enter_context(RunLock(run_dir))
            # Runs before the lock is released (the stack unwinds in reverse).
            owned.push(lambda typ, *_: typ is not None and _undo_start(run_dir, made, before))
            # Before looking for checkpoints: a complete temporary may be put in place.
            remove_stale_temporaries(run_dir)
            set_aside_strays(run_dir)
            resume_from = resume_checkpoint(cfg, run_dir)
            if resume_from is None:
                start = "new run"
            elif resume_from.resolve().parent.parent == run_dir.resolve():  # `output_dir` may be relative
                start = f"resuming from {resume_from.name}"
            else:
                start = f"a new run from {resume_from}"
            log.info("run directory: %s (%s)", run_dir, start)
            return run_dir, resume_from

        run_dir, resume_from = distributed.on_main(claim)
        yield RunDir(run_dir, cfg, resume_from, lock)


def _missing_dirs(run_dir: Path) -> list[Path]:
    """`run_dir` and those of its parents that do not exist yet, deepest first: what a launch makes."""
    missing, path = [], Path(os.path.abspath(run_dir))
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def _undo_start(run_dir: Path, made: list[Path], before: set[str]) -> bool:
    """After a launch into `run_dir` failed: when it added nothing of the run (no checkpoint, no metrics
    record, no evaluation; only the lock file, an empty metrics file and the curves of no records), remove
    what it added (never an entry of `before`, what the directory held already: a user's files, a lock file
    left by an earlier run) and the directories of `made` (`_missing_dirs`). Returns False, so that the
    exception goes on."""
    try:
        added = set(os.listdir(run_dir)) - before
        if METRICS_FILE in added and (run_dir / METRICS_FILE).stat().st_size > 0:
            return False
        if not added <= {LOCK_FILE, CURVES_FILE, METRICS_FILE}:
            return False
        for name in added:
            (run_dir / name).unlink()
        for path in made:
            path.rmdir()  # stops at the first that holds anything (OSError)
        if made:
            log.info("removed %s, which the failed launch had made", made[-1])
    except OSError:
        pass  # what cannot be removed stays; the launch's own error is what matters
    return False


def _name_run_dir(cfg: DictConfig) -> Path:
    """`output_dir`, or a new timestamped directory under `outputs/train/` (which `cfg.output_dir` then names)."""
    if cfg.output_dir is None:
        if cfg.training.resume == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        now = dt.datetime.now()
        cfg.output_dir = str(
            Path("outputs/train")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{cfg.env.name}_{cfg.policy.name}"
        )
    return Path(cfg.output_dir)
