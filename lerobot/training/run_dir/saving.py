"""Saving a checkpoint into a run directory (`save_checkpoint`): written whole by the checkpoint format
(`lerobot.checkpoints.run_writer`), by the directory's owner only, and `checkpoints/last` moved to it.

`last` never moves back: a save of a step lower than the one `last` points at means that another run writes
the directory, and it is refused, before writing and again before `last` moves (the write took a while). Only
a diverged run moves `last` back, to its last good checkpoint (`set_last`, from `lerobot.training.guard`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot.checkpoints.run_layout import CHECKPOINTS_DIR, LAST_LINK, is_complete
from lerobot.checkpoints.run_writer import CheckpointFiles, write_checkpoint
from lerobot.errors import RunDirError
from lerobot.training.run_dir.lock import RunLock

# The new `last` link, made beside the old one and renamed over it (`set_last`).
LAST_TMP = f".{LAST_LINK}.tmp"


def save_checkpoint(run_dir: Path, files: CheckpointFiles, lock: RunLock | None = None) -> Path:
    """Write the checkpoint `files` (`checkpoint_files`) atomically and point `last` at it; return its
    directory.

    `lock`: the lock of `run_dir` this process holds, if any (`RunLock`). Raises `NonFiniteWeightsError`
    (writing nothing) when the weights to save, or the policy's own, are not finite, `CheckpointError` naming
    the path and the space needed when the disk is full, and `RunDirError` when this process no longer owns
    `run_dir` (`RunLock.verify`) or `last` points at a later step (another writer); in every failure the
    temporary directory is removed and the previous checkpoints stay as they were.
    """
    step = files.step
    if lock is not None:
        lock.verify()  # before anything is made in it
    _refuse_behind_last(run_dir, step, f"not saving checkpoint {step:09d}")
    final = write_checkpoint(run_dir, files)
    _refuse_behind_last(run_dir, step, f"checkpoint {step:09d} was written but `last` stays")  # again
    set_last(run_dir, final)
    return final


def _refuse_behind_last(run_dir: Path, step: int, what: str) -> None:
    """Raise `RunDirError` (`what`: the message's start) when `last` points at a complete checkpoint of a
    later step than `step`: another run writes `run_dir`."""
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    if not link.is_symlink():
        return
    target = link.resolve()
    if target.parent != link.parent.resolve() or not target.name.isdigit() or not is_complete(target):
        return  # dangling (resumed from the newest complete checkpoint), or pointed elsewhere by hand
    if int(target.name) > step:
        raise RunDirError(
            f"{what}: {link} points at {target.name}, a later step, which another run writing {run_dir} "
            "saved; a run directory takes one writer at a time: stop the other run, or train into another "
            "output_dir"
        )


def set_last(run_dir: Path, ckpt_dir: Path) -> None:
    """Point `run_dir/checkpoints/last` at `ckpt_dir` (atomically: a new link renamed over the old one)."""
    parent = Path(run_dir) / CHECKPOINTS_DIR
    tmp_link = parent / LAST_TMP
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(Path(ckpt_dir).name)
    os.replace(tmp_link, parent / LAST_LINK)
