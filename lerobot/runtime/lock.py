"""One writer per run directory: a lock on `run_dir/run.lock` holding the owner's pid and host.

It is a POSIX record lock (`fcntl.lockf`), which the kernel drops when its process exits however it exits
(even SIGKILL), and which forked worker processes do not inherit: a lock left by a dead run is taken over with
a message, a live one stops the second launch with one line naming its owner.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from lerobot.errors import RunDirError

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


class RunLock:
    """Exclusive ownership of a run directory by this process, recorded as `pid host` in `run.lock`."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `RunDirError` naming the live owner; take over a dead owner's lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunDirError(
                f"{self.path.parent} is in use by another training run ({_owner(self.path) or 'owner unknown'}); "
                "wait for it to end, stop it, or pick another output_dir"
            ) from None
        previous = os.pread(fd, 256, 0).decode(errors="replace").strip()
        if previous:
            log.warning("%s: taking over the lock left by a run that has ended (%s)", self.path, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Empty the lock file (a clean end leaves no owner behind) and drop the lock."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor releases the record lock
        self._fd = None


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


# Locks held by this process, by run directory, until the trainer's loop ends (`release_run_dir`) or the
# process exits (the kernel drops them then).
_held: dict[Path, RunLock] = {}


def lock_run_dir(run_dir: Path) -> None:
    """Make this process the only writer of `run_dir` (see `RunLock`); a no-op if it already is."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    lock = RunLock(run_dir)
    lock.acquire()
    _held[key] = lock


def release_run_dir(run_dir: Path) -> None:
    """Give up the lock `lock_run_dir` took (if any)."""
    lock = _held.pop(Path(run_dir).resolve(), None)
    if lock is not None:
        lock.release()
