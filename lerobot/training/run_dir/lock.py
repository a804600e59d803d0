"""One writer per run directory: an exclusive lock on the run directory itself, with `run.lock` naming the
owner (`RunLock`).

The lock is a `flock` on a descriptor of the directory (not of a file in it), so deleting or replacing
`run.lock` lets no second run in. The kernel drops it when its process exits however it exits (even SIGKILL),
and forked children (loader and env workers) close their inherited copy at once, so a lock is never held by
anything but its owner: a lock left by a dead run is taken over with a message, a live one stops the second
launch with one line naming its owner.

`run.lock` is the human-readable record of the owner (`pid=... host=...`). A second launch names the owner
from it, or, when it was deleted, from `/proc/locks`. Before each checkpoint write the owner checks that it
still owns the directory (`RunLock.verify`): the path must still name the directory it locked (not one made
in its place, which another run may own), and a deleted `run.lock` is rewritten. A POSIX record lock
(`fcntl.lockf`) on `run.lock` is taken as well: runs of older versions, which locked only that file, are kept
out too. Where the file system cannot lock a directory (some network file systems), that record lock is
the only one, with a warning.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from lerobot.errors import RunDirError
from lerobot.runtime.files import open_dir, try_flock

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


class RunLock:
    """Exclusive ownership of a run directory by this process, recorded as `pid host` in `run.lock`.

    Taken by `acquire` and given up by `release`, or held for a `with` block::

        with RunLock(run_dir):
            ...  # this process is the only writer of run_dir
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._dir_fd: int | None = None  # the directory, flock-ed
        self._fd: int | None = None  # run.lock, lockf-ed
        self._dir_locked = False  # False where the file system cannot lock a directory

    @staticmethod
    def record() -> str:
        """What `run.lock` holds while this process owns the directory."""
        return f"pid={os.getpid()} host={socket.gethostname()}\n"

    def acquire(self) -> None:
        """Take the lock, or raise `RunDirError` naming the live owner; take over a dead owner's lock."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dir_fd = open_dir(self.run_dir)
        try:
            taken = try_flock(dir_fd)
            if taken is False:
                owner = _owner(self.path) or _flock_holder(dir_fd) or "owner unknown"
                raise RunDirError(self._in_use(owner))
            if taken is None:
                log.warning(
                    "%s: the file system cannot lock a directory; only %s keeps other runs out (deleting it "
                    "lets a second run in)",
                    self.run_dir,
                    LOCK_FILE,
                )
            fd = self._lock_file()
            if fd is None:  # a run of an older version, which locks only this file
                raise RunDirError(self._in_use(_owner(self.path) or "owner unknown"))
        except BaseException:
            os.close(dir_fd)
            raise
        previous = os.pread(fd, 256, 0).decode(errors="replace").strip()
        if previous:
            log.warning("%s: taking over the lock left by a run that has ended (%s)", self.path, previous)
        self._dir_fd, self._fd = dir_fd, fd
        self._dir_locked = taken is True
        self._write_record()
        _open_locks.add(self)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def verify(self) -> None:
        """Check, before writing a checkpoint, that this process still owns the run directory.

        Raises `RunDirError` when the path no longer names the directory that was locked (it was moved or
        deleted, and maybe made anew by another run); rewrites `run.lock` when it was deleted or changed.
        """
        if self._dir_fd is None:
            raise RunDirError(f"{self.run_dir}: this process does not hold its lock")
        held = os.fstat(self._dir_fd)
        try:
            now = os.stat(self.run_dir)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise RunDirError(
                f"{self.run_dir} is no longer the directory this run locked (it was moved or deleted while the "
                "run was writing it, and another run may own the one there now); stopping without saving, "
                "so that two runs' files do not mix: find out what moved it, then relaunch into a fresh "
                "output_dir (or resume the moved directory from where it is now)"
            )
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            on_disk = None
        mine = os.fstat(self._fd)
        if on_disk is None or (on_disk.st_dev, on_disk.st_ino) != (mine.st_dev, mine.st_ino):
            fd = self._lock_file()
            if fd is None:
                raise RunDirError(
                    f"{self.path} was replaced by another training run's ({_owner(self.path) or 'owner unknown'}) "
                    f"while this run owns {self.run_dir}: two runs write there; this one stops without saving: "
                    "stop the other one and resume with training.resume=true"
                )
            os.close(self._fd)
            self._fd = fd
            self._write_record()
            log.warning(
                "%s was deleted (or replaced) while this run owns %s; rewrote it%s",
                self.path,
                self.run_dir,
                " (the directory itself stayed locked: no other run could start there)"
                if self._dir_locked
                else "",
            )
        elif os.pread(self._fd, 256, 0).decode(errors="replace") != self.record():
            self._write_record()
            log.warning("%s was changed while this run owns %s; rewrote it", self.path, self.run_dir)

    def release(self) -> None:
        """Empty the lock file (a clean end leaves no owner behind) and drop the locks."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        self._close()

    def _close(self) -> None:
        """Close both descriptors (which drops the locks) without touching `run.lock`."""
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = None
        _open_locks.discard(self)

    def _lock_file(self) -> int | None:
        """`run.lock` opened (made when missing) and record-locked; None when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def _write_record(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, self.record().encode(), 0)

    def _in_use(self, owner: str) -> str:
        return (
            f"{self.run_dir} is in use by another training run ({owner}); wait for it to end, stop it, or pick "
            "another output_dir"
        )


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _flock_holder(fd: int) -> str:
    """`pid=N host=H; ...` of the process holding a `flock` on the file of `fd`, read from `/proc/locks`
    (Linux, this host); "" when it cannot be found. Names the owner when `run.lock` was deleted."""
    st = os.fstat(fd)
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        # "3: FLOCK  ADVISORY  WRITE 4242 fe:00:2236463 0 EOF"; a waiting lock has "->" after the number,
        # and the pid is 0 (or negative) for a process outside this PID namespace.
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file_id and fields[4].isdigit():
            pid = int(fields[4])
            if pid > 0:
                return f"pid={pid} host={socket.gethostname()}; {LOCK_FILE} was deleted"
    return ""


# Every lock this process holds (acquired and not released): the fork handler closes them in children.
_open_locks: set[RunLock] = set()


def _forget_in_child() -> None:
    """In a forked child: close the inherited lock descriptors, so that the child never holds a lock (a
    `flock` lasts while any copy of its descriptor is open); the parent's locks stay as they are."""
    for lock in list(_open_locks):
        for fd in (lock._fd, lock._dir_fd):
            if fd is not None:
                os.close(fd)
        lock._fd = lock._dir_fd = None
    _open_locks.clear()


os.register_at_fork(after_in_child=_forget_in_child)
