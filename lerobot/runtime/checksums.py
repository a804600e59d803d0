"""Checksums of a checkpoint's files: `checksums.json` holds the sha256 of every file written with it.

`write_checksums(dir)` hashes every regular file under `dir` (sub-directories included, so files that other
formats add next to the training state are covered as long as they are written before it) and flushes each
one to disk. `verify_checksum(dir, name)` re-hashes one file before it is read and raises `ChecksumError`
when the bytes differ from those that were saved. Checkpoints written before checksums existed have no
`checksums.json`; their files are read unverified (with a warning). A checkpoint written with checksums
records that in its weights' header, and `lerobot.checkpoints.run` refuses it when the file is missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from lerobot.errors import ChecksumError

log = logging.getLogger(__name__)

CHECKSUMS_FILE = "checksums.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(directory: Path) -> dict[str, str]:
    """Fsync every file under `directory` and record its sha256 in `directory/checksums.json`; return them.

    Call it last, when every file of the checkpoint is written: files added afterwards are not covered.
    """
    directory = Path(directory)
    sums = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(directory).as_posix()
        if name == CHECKSUMS_FILE:
            continue
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # the checksum vouches for bytes that are on the disk, not in the page cache
        sums[name] = file_sha256(path)
    target = directory / CHECKSUMS_FILE
    with open(target, "w") as f:
        json.dump({"sha256": sums}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    return sums


def read_checksums(directory: Path) -> dict[str, str] | None:
    """The recorded sha256 per file of `directory`; None when it has no `checksums.json` (older checkpoint)."""
    path = Path(directory) / CHECKSUMS_FILE
    if not path.exists():
        return None
    try:
        sums = json.loads(path.read_text())["sha256"]
        if not isinstance(sums, dict):
            raise TypeError(f"'sha256' is a {type(sums).__name__}")
        return sums
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ChecksumError(f"{path} is unreadable or corrupt ({e})") from None


def verify_checksum(directory: Path, name: str) -> bool:
    """Check `directory/name` against `checksums.json`; True when verified, False when there is no record.

    Raises `ChecksumError` when the file's sha256 differs from the recorded one.
    """
    sums = read_checksums(directory)
    if sums is None or name not in sums:
        log.warning("%s has no recorded checksum (saved by an older version?); reading it unverified", name)
        return False
    actual = file_sha256(Path(directory) / name)
    if actual != sums[name]:
        raise ChecksumError(
            f"{Path(directory) / name} is corrupt: its sha256 {actual[:12]}... differs from the "
            f"{sums[name][:12]}... recorded in {CHECKSUMS_FILE} when it was saved"
        )
    return True
