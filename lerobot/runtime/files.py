"""A run's files, written safely: whole or none (`atomic_write`, `TemporaryDir`), resting on `flock`, which the
kernel drops when its holder dies however it dies (`try_flock`; the run directory's own lock, one writer per
run directory, is `lerobot.training.run_dir.lock.RunLock`).

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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def user_cache_dir() -> Path:
    """This project's cache in the user's home: `$XDG_CACHE_HOME/lerobot`, else `~/.cache/lerobot`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lerobot"


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
