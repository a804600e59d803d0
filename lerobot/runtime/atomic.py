"""Whole files or none: every file the project writes goes through `atomic_write`.

A file is written under a temporary name beside its final one and renamed over it when complete, so a kill
or a full disk at any moment leaves the old file (or no file), never a truncated one. The temporary is made
by the writer itself (not `tempfile`, whose files are 0600), so the file's mode follows the user's umask; it
keeps the final name's suffix, for writers that pick a format by it (videos, images).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

# errno values of a full disk, a full quota and an exceeded file size limit.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def temporary_sibling(path: Path) -> Path:
    """A fresh hidden name beside `path` (same folder, same suffix) for writing it atomically."""
    return path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


def atomic_write(path: Path | str, write: Callable[[Path], object], fsync: bool = False) -> Path:
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it over `path`; return `path`.

    The temporary is removed when `write` (or the rename) fails. `fsync`: flush the file to the disk before
    the rename, for files whose loss after a power cut would cost more than rewriting them.
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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path | str, text: str, fsync: bool = False) -> Path:
    """Write `text` to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text), fsync=fsync)


def write_json(path: Path | str, data: Any, indent: int = 2, fsync: bool = False) -> Path:
    """Write `data` as JSON to `path` atomically (its folder is created when missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, json.dumps(data, indent=indent), fsync=fsync)


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
