"""Installing a conversion: a converted dataset is written into a temporary sibling, checked by opening it
as an `EpisodeDataset`, and renamed into place; a current, intact conversion is kept (`write_conversion`)."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from lerobot.datasets.episode_dataset import EpisodeDataset
from lerobot.datasets.format import check_free_space, out_of_space_error, read_meta
from lerobot.errors import DatasetError, DatasetNotFoundError
from lerobot.runtime.files import pid_alive

log = logging.getLogger(__name__)


def is_current(out_dir: Path, fingerprint: str) -> bool:
    """Whether `out_dir` holds a conversion of the source with this `fingerprint`."""
    try:
        meta = read_meta(out_dir)
    except (DatasetError, DatasetNotFoundError):
        return False
    return meta.get("source", {}).get("fingerprint") == fingerprint


def is_intact(out_dir: Path) -> bool:
    """Whether a current conversion still opens and passes its checks; if not, log why (it is rebuilt)."""
    try:
        EpisodeDataset(out_dir)
    except (DatasetError, DatasetNotFoundError) as e:
        log.warning("%s; converting again from the source", e)
        return False
    return True


def remove_stale_temps(parent: Path, name: str) -> None:
    """Delete temp/old directories of `name` left by processes that no longer run (crashes, kills)."""
    for leftover in parent.glob(f".{name}.*-*-*"):
        try:
            pid = int(leftover.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(leftover, ignore_errors=True)


def install_conversion(tmp: Path, out_dir: Path, fingerprint: str, replace_current: bool) -> None:
    """Rename the finished `tmp` to `out_dir`, replacing an outdated conversion; tolerate a racing twin.

    `replace_current`: `out_dir` held this source's conversion when we started (forced or damaged), so
    replace it even though its fingerprint matches.
    """
    old = None
    if out_dir.exists():
        if not replace_current and is_current(out_dir, fingerprint):
            return  # another process finished the same conversion meanwhile
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not is_current(out_dir, fingerprint):
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_conversion(
    out_dir: Path, fingerprint: str, needed_bytes: int, write: Callable[[Path], None], force: bool = False
) -> bool:
    """Convert a source into `out_dir` atomically; return False when nothing had to be written.

    Idempotent: an intact conversion of the source with `fingerprint` is kept unless `force`. Atomic: `write`
    fills a temporary sibling `.{name}.tmp-<pid>-<id>` (after a free-space check for `needed_bytes`), which
    is then renamed into place; a full disk is one `DatasetError` and no temporary is left behind.
    """
    current = is_current(out_dir, fingerprint)
    if current and not force and is_intact(out_dir):
        return False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir.parent, out_dir.name)
    check_free_space(out_dir.parent, needed_bytes)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write(tmp)
        install_conversion(tmp, out_dir, fingerprint, replace_current=current)
    except OSError as e:
        if (error := out_of_space_error(e, out_dir.parent, needed_bytes)) is not None:
            raise error from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True
