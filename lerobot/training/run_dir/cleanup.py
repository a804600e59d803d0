"""What a run directory no longer holds: the temporaries that killed saves left (`remove_stale_temporaries`),
files or links where a checkpoint directory belongs (`set_aside_strays`, renamed aside, never deleted) and
the checkpoints the run no longer keeps (`prune_checkpoints`, `training.keep_checkpoints`).

A checkpoint is written into a temporary that its writer holds a `flock` on
(`lerobot.checkpoints.run_writer`); a temporary whose lock can be taken was left by a writer that is gone,
however it died, and is removed when a run starts in the directory, or, when it is complete and its step has
no checkpoint, put in place.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path

from lerobot.checkpoints import run_layout, run_writer
from lerobot.errors import ChecksumError
from lerobot.runtime.checksums import CHECKSUMS_FILE, file_sha256, read_checksums
from lerobot.runtime.files import open_dir, pid_alive, try_flock
from lerobot.training.run_dir.saving import LAST_TMP

log = logging.getLogger(__name__)


def remove_stale_temporaries(run_dir: Path) -> None:
    """Remove the temporary checkpoint directories that killed runs left in `run_dir/checkpoints/`.

    A temporary is stale when its `flock` can be taken: its writer, which held it while writing, has exited
    (the kernel dropped the lock), whatever pid its name holds, in whatever PID namespace it ran. The lock
    is kept while the temporary is removed or put in place. Temporaries of older versions, which took no
    lock, are stale when the process named in them is no longer alive on this host, when they were made on
    another host (a run directory has one writer at a time) or when they name no writer.
    A stale temporary that is complete and verifies against its checksums, while its step has no
    checkpoint (a kill between renaming the old copy aside and the new one in place), becomes that
    checkpoint; every other one is deleted.
    """
    parent = Path(run_dir) / run_layout.CHECKPOINTS_DIR
    if not parent.is_dir():
        return
    if (parent / LAST_TMP).is_symlink():
        (parent / LAST_TMP).unlink()
    stale, locks = [], []
    try:
        for path in parent.glob(f"{run_writer.TEMPORARY_PREFIX}*"):
            gone, lock = _claim_if_stale(path)
            if lock is not None:
                locks.append(lock)
            if gone:
                stale.append(path)
        _remove_or_recover(parent, stale)
    finally:
        for lock in locks:
            os.close(lock)


def _remove_or_recover(parent: Path, stale: list[Path]) -> None:
    """Put the complete, verified stale temporaries of steps without a checkpoint in place; delete the rest."""
    freed, removed = 0, 0
    for tmp in sorted(stale, key=lambda p: p.lstat().st_mtime, reverse=True):  # newest copy of a step first
        step = tmp.name[len(run_writer.TEMPORARY_PREFIX) :].split("-")[0]
        final = parent / step
        if step.isdigit() and not final.exists() and _verifies(tmp):
            os.replace(tmp, final)
            log.warning("recovered checkpoint %s from the complete temporary %s", final, tmp.name)
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            freed += sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file() and not p.is_symlink())
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info(
            "removed %d stale temporary checkpoint directories from %s (%s)",
            removed,
            parent,
            run_writer.megabytes(freed),
        )


def _claim_if_stale(path: Path) -> tuple[bool, int | None]:
    """Whether the temporary `path` is stale, and a descriptor holding its lock when it was taken (so that
    no other cleaner takes it meanwhile); the caller closes it."""
    parts = path.name[len(run_writer.TEMPORARY_PREFIX) :].split("-", 3)
    if len(parts) < 4 or parts[2] != run_writer.LOCKED:
        return _old_writer_is_gone(path.name), None
    if path.is_symlink() or not path.is_dir():
        return True, None
    try:
        fd = open_dir(path)
    except FileNotFoundError:  # gone meanwhile
        return False, None
    taken = try_flock(fd)
    if taken:
        return True, fd
    os.close(fd)
    if taken is None:  # a file system that cannot lock directories: the writer's name is all there is
        return _old_writer_is_gone(path.name), None
    return False, None


def _old_writer_is_gone(name: str) -> bool:
    """Whether the writer named in a temporary's name (`...-<host>@<pid>`) is gone: this check is for the
    temporaries of older versions (they took no lock); a pid says nothing across PID namespaces."""
    pid = name.rpartition("@")[2]
    if not pid.isdigit():
        return True
    if not name.endswith(f"-{socket.gethostname()}@{pid}"):
        return True
    return not pid_alive(int(pid))


def _verifies(directory: Path) -> bool:
    try:
        sums = read_checksums(directory)
    except ChecksumError:
        return False
    if not sums or not {run_layout.MODEL_FILE, run_layout.CONFIG_FILE} <= set(sums):
        return False
    return all((directory / n).is_file() and file_sha256(directory / n) == h for n, h in sums.items())


def set_aside_strays(run_dir: Path) -> list[Path]:
    """Rename aside (`run_writer.set_aside`) every entry of `run_dir/checkpoints/` named like a checkpoint (a step)
    that is not a directory: a file or a link put where a checkpoint was. Each is a warning; the run then
    resumes from the newest real checkpoint, and saving that step again finds its name free. Returns the
    new names."""
    parent = Path(run_dir) / run_layout.CHECKPOINTS_DIR
    if not parent.is_dir():
        return []
    moved = []
    for path in sorted(p for p in parent.iterdir() if p.name.isdigit() and run_writer.is_stray(p)):
        moved.append(run_writer.set_aside(path))
        log.warning(
            "%s is not a checkpoint directory (a file or a link was put in its place): renamed it to %s and "
            "left it there; the run goes on from the newest checkpoint that is whole",
            path,
            moved[-1].name,
        )
    return moved


def prune_checkpoints(run_dir: Path, keep: int, also_keep: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """Delete the checkpoints of `run_dir` older than its newest `keep` (counted up to the one `last` points
    at); never the one `last` points at, nor those of `also_keep`. Checkpoints of later steps than `last`'s
    (a diverged run's, kept for inspection) are neither counted nor deleted. Returns the deleted steps.

    Each is renamed aside to a locked temporary first, so that it leaves the listing at once, and its
    checksums go first, so that a kill during the deletion leaves a temporary that the next start removes
    rather than puts back.
    """
    last = run_layout.latest_checkpoint(run_dir)
    if last is None:
        return []
    kept = {last.name, *(Path(p).name for p in also_keep)}
    found = [p for p in run_layout.list_checkpoints(run_dir) if int(p.name) <= int(last.name)]
    doomed = [p for p in found[: max(len(found) - keep, 0)] if p.name not in kept]
    for ckpt in doomed:
        aside, lock = run_writer.move_aside(ckpt)
        try:
            (aside / CHECKSUMS_FILE).unlink(missing_ok=True)
            shutil.rmtree(aside, ignore_errors=True)
        finally:
            os.close(lock)
    return [p.name for p in doomed]
