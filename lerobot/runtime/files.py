"""A run's files, written safely: whole or none (`atomic_write`), and one writer per run directory
(`RunLock`). Both rest on `flock`, which the kernel drops when its holder dies however it dies.

## Whole files or none

A file is written under a temporary name beside its final one and renamed over it when complete, so a kill
or a full disk at any moment leaves the old file (or no file), never a truncated one. The temporary is made
by the writer itself (not `tempfile`, whose files are 0600), so the file's mode follows the user's umask; it
keeps the final name's suffix, for writers that pick a format by it (videos, images). A full disk (or file
size limit) raises an OSError that names the final file, however the writer reported it.

Logs that grow by lines (`metrics.jsonl`) are appended to with `append_line`: a line is appended whole or,
on a full disk, not at all.

A whole directory is written the same way through `TemporaryDir`: a hidden sibling that its writer holds a
lock on (`flock`) until it is renamed into place, so that `remove_stale_temporary_dirs` can tell the
temporaries a killed writer left from the ones being written, in any process, PID namespace or container
that shares the file system.

## One writer per run directory

One writer per run directory: an exclusive lock on the run directory itself, with `run.lock` naming the owner.

The lock is a `flock` on a descriptor of the directory (not of a file in it), so deleting or replacing
`run.lock` lets no second run in. The kernel drops it when its process exits however it exits (even SIGKILL),
and forked children (loader and env workers) close their inherited copy at once, so a lock is never held by
anything but its owner: a lock left by a dead run is taken over with a message, a live one stops the second
launch with one line naming its owner.

`run.lock` is the human-readable record of the owner (`pid=... host=...`). A second launch names the owner
from it, or, when it was deleted, from `/proc/locks`. Before each checkpoint write the owner checks that it
still owns the directory (`verify_run_dir`): the path must still name the directory it locked (not one made
in its place, which another run may own), and a deleted `run.lock` is rewritten. A POSIX record lock
(`fcntl.lockf`) on `run.lock` is taken as well: runs of older versions, which locked only that file, are kept
out too. Where the file system cannot lock a directory (some network file systems), that record lock is
the only one, with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lerobot.errors import RunDirError

log = logging.getLogger(__name__)

# errno values of a full disk, a full quota and an exceeded file size limit.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def path_within(root: Path | str, relative: str | Path) -> Path | None:
    """`root / relative` (`relative` with its `.` and `..` folded), when that lies strictly inside `root`;
    None when it does not (an absolute `relative`, one whose `..` climb out, one that names `root` itself).

    The test is on the names alone: symbolic links inside `root` are followed when the path is opened, as
    they must be for the huggingface_hub cache, whose snapshot files link to blobs outside the snapshot.
    """
    if Path(relative).is_absolute():
        return None
    base = os.path.normpath(root)
    joined = os.path.normpath(os.path.join(base, relative))
    if joined == base or os.path.commonpath([base, joined]) != base:
        return None
    return Path(root) / os.path.relpath(joined, base)  # `root` as the caller spells it


def temporary_sibling(path: Path) -> Path:
    """A fresh hidden name beside `path` (same folder, same suffix) for writing it atomically."""
    return path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


def remove_dead_writers_temporaries(directory: Path | str) -> int:
    """Delete the file temporaries (`temporary_sibling`) in `directory` whose writer is gone; return how many.

    A temporary names its writer's PID: it is gone when no process has that PID here, or when the PID is
    this process's own (which is only starting to write there; a killed writer's PID comes back as PID 1 of
    a container). Call it only where no other process may be writing at the same time (a directory this
    process holds a lock on): a writer in another PID namespace looks gone too.
    """
    directory, removed = Path(directory), 0
    if not directory.is_dir():
        return 0
    for path in directory.glob(".*.tmp*"):
        match = _TEMPORARY_NAME.fullmatch(path.name)
        if match is None or path.is_dir() or (int(match[1]) != os.getpid() and pid_alive(int(match[1]))):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


# `temporary_sibling`'s names: `.<stem>.<pid>-<8 hex digits>.tmp<suffix>`.
_TEMPORARY_NAME = re.compile(r"\..*\.(\d+)-[0-9a-f]{8}\.tmp(?:\.[^/]*)?")


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists here (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write(path: Path | str, write: Callable[[Path], object], fsync: bool = False) -> Path:
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it over `path`; return `path`.

    The temporary is removed when `write` (or the rename) fails; a full disk or file size limit is then an
    OSError naming `path` (writers report it without a file name, or with the temporary's). `fsync`: flush
    the file to the disk before the rename, for files whose loss after a power cut would cost more than
    rewriting them.
    """
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        write(tmp)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = no_space_error(e)
        if full is not None:
            raise OSError(full.errno, full.strerror, str(path)) from e
        raise
    return path


def write_text(path: Path | str, text: str, fsync: bool = False) -> Path:
    """Write `text` to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text), fsync=fsync)


def write_json(path: Path | str, data: Any, indent: int = 2, fsync: bool = False) -> Path:
    """Write `data` as JSON to `path` atomically (its folder is created when missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, json.dumps(data, indent=indent), fsync=fsync)


def append_line(path: Path | str, line: str) -> None:
    """Append `line` (ending with a newline) to `path`, whole or not at all.

    On a full disk or file size limit the file is cut back to where it ended, so that no half line is left,
    and the OSError names `path` (a write reports none).
    """
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as e:
            if e.errno not in NO_SPACE_ERRNOS:
                raise
            os.ftruncate(fd, end)
            raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        os.close(fd)


def no_space_error(e: BaseException | None) -> OSError | None:
    """The OSError saying that a disk or the file size limit is full, among `e` and its causes; else None.

    torch wraps the OSError of a failed write into a RuntimeError, so the chain is searched.
    """
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
            return e
        e = e.__cause__ or e.__context__
    return None


# ------------------------------------------------------------------------------------------ directories
# The file in a `TemporaryDir` that its writer holds an exclusive `flock` on while it fills the directory.
WRITER_LOCK_FILE = ".writer.lock"
# How long a temporary directory without a lock file is left alone after its last change: its writer may be
# between making it and locking it, or between dropping the lock file and renaming it (both a matter of
# microseconds). Older than this, it was left by a writer killed in between, or by one that took no lock.
UNLOCKED_GRACE_S = 60.0


def temporary_prefix(final: Path) -> str:
    """The name every temporary directory of `final` starts with: `.<name>.tmp-`."""
    return f".{Path(final).name}.tmp-"


class TemporaryDir:
    """A hidden directory beside `final`, `.<name>.tmp-<pid>-<random>`, filled by this process and renamed
    to `final` when complete; removed when left without `install` (an error, a signal).

    While it exists, this process holds an exclusive `flock` on its `WRITER_LOCK_FILE`. The kernel drops the
    lock when the process ends, however it ends (SIGKILL included), and it does not depend on process ids,
    so a lock that can be taken marks a temporary whose writer is gone (`remove_stale_temporary_dirs`)::

        with TemporaryDir(out_dir) as tmp:
            write_everything(tmp.path)
            tmp.install()
    """

    def __init__(self, final: Path | str):
        self.final = Path(final)
        self.path = self.final.parent / f"{temporary_prefix(self.final)}{os.getpid()}-{secrets.token_hex(4)}"
        self._fd: int | None = None

    def __enter__(self) -> TemporaryDir:
        self.path.mkdir()
        try:
            self._fd = os.open(self.path / WRITER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._close()
            raise
        return self

    def install(self, replace: bool = True) -> None:
        """Rename the finished directory to `final`, replacing a directory there; with `replace=False` a
        `final` that another writer filled meanwhile is kept and `FileExistsError` raised (the rename itself
        refuses a non-empty directory, so two writers racing for `final` cannot both win).

        The lock file is removed first (it is no part of the result), but the lock stays held until the
        rename is done: a cleaner that opened the file before sees a live writer, one that comes after finds
        a directory without a lock file changed a moment ago, which it leaves alone too.
        """
        (self.path / WRITER_LOCK_FILE).unlink()
        if replace and self.final.exists():
            shutil.rmtree(self.final)
        try:
            os.rename(self.path, self.final)
        except OSError as e:
            if replace or e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
            raise FileExistsError(errno.EEXIST, "exists already", str(self.final)) from None

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def _close(self) -> None:
        """Remove what is left of the directory (nothing after `install`), then drop the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_stale_temporary_dirs(final: Path | str) -> tuple[int, int]:
    """Delete the temporary directories of `final` (`TemporaryDir`) whose writer is gone; return how many
    were deleted and the bytes they held. Those a live writer holds are left alone (`writer_is_alive`)."""
    final = Path(final)
    if not final.parent.is_dir():
        return 0, 0
    removed, freed = 0, 0
    for tmp in final.parent.glob(glob.escape(temporary_prefix(final)) + "*"):
        if tmp.is_symlink() or not tmp.is_dir() or writer_is_alive(tmp):
            continue
        freed += _tree_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        removed += 1
    return removed, freed


def _tree_bytes(directory: Path) -> int:
    """Bytes of the files under `directory`; files that vanish meanwhile (another cleaner) count 0."""
    total = 0
    for parent, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def writer_is_alive(tmp: Path) -> bool:
    """Whether a process still writes the temporary directory `tmp`: its lock file is locked, or it has no
    lock file and changed within `UNLOCKED_GRACE_S` seconds (see the constant)."""
    try:
        fd = os.open(Path(tmp) / WRITER_LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        try:
            return time.time() - Path(tmp).stat().st_mtime < UNLOCKED_GRACE_S
        except FileNotFoundError:  # renamed into place (or removed) meanwhile: nothing to clean
            return True
    except PermissionError:  # another user's, which we may not open: left alone
        return True
    try:
        return try_flock(fd) is not True  # held by its writer, or not lockable here: left alone
    finally:
        os.close(fd)


LOCK_FILE = "run.lock"


def open_dir(path: Path) -> int:
    """A read-only descriptor of the directory `path` (closed on exec), to lock it with `try_flock`."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def try_flock(fd: int) -> bool | None:
    """Take an exclusive `flock` on `fd` without waiting: True when taken, False when another open file
    holds it, None when the file system does not support it there."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None
        raise
    return True


class RunLock:
    """Exclusive ownership of a run directory by this process, recorded as `pid host` in `run.lock`.

    Taken by `acquire` and given up by `release`, or held for a `with` block::

        with RunLock(run_dir):
            ...  # this process is the only writer of run_dir
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.resolved: Path | None = None  # the locked directory's resolved path, while held
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
        self.resolved = self.run_dir.resolve()
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


# Every lock this process holds (acquired and not released): the fork handler closes them in children, and
# `verify_run_dir` finds the one of a run directory among them.
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


def verify_run_dir(run_dir: Path) -> None:
    """When this process holds the lock of `run_dir` (`RunLock`), check that it still owns it
    (`RunLock.verify`); a no-op otherwise (library use that took no lock)."""
    key = Path(run_dir).resolve()
    lock = next((lk for lk in _open_locks if lk.resolved == key), None)
    if lock is None:  # the path may resolve elsewhere now (moved, replaced by a link): compare as given
        lock = next(
            (lk for lk in _open_locks if os.path.abspath(lk.run_dir) == os.path.abspath(run_dir)), None
        )
    if lock is not None:
        lock.verify()
