"""How much disk a checkpoint takes, estimated from above before it is written (`checkpoint_bytes`), so that a
save that cannot fit is refused before it changes anything."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

# `torch.save` writes a zip archive: "archive/data.pkl", one "archive/data/<n>" record per storage and a few
# small records (version, byte order, ...). A record takes a local header (30 bytes, 4 of them an extra
# field), up to 63 bytes of padding that aligns its data to 64 bytes, a data descriptor (16 bytes, 24 in
# zip64), a central directory entry (46 bytes) and its name twice; past 4 GB, zip64 fields add 48 bytes. The
# end records take 98 bytes.
_ZIP_RECORD_BYTES = 30 + 4 + 63 + 24 + 46 + 2 * len("archive/data/0123456789")
_ZIP64_RECORD_BYTES = 48
_ZIP_FIXED_BYTES = 8 * (_ZIP_RECORD_BYTES + _ZIP64_RECORD_BYTES + 64) + 128
# A line of `checksums.json` per file (name and sha256), and its braces.
_CHECKSUM_LINE_BYTES = 128


def checkpoint_bytes(parent: Path, file_sizes: list[int], training_state: dict[str, Any] | None) -> int:
    """An upper bound of the disk space a new checkpoint takes in `parent`.

    The files of known size (`file_sizes`: the weights and the texts, serialized before this is asked),
    the `torch.save` archive of `training_state` and `checksums.json`, each rounded up to whole blocks of
    the file system and given room for the file system's own records of where those blocks are; and a
    block for the checkpoint directory, one for `parent` growing.
    """
    sizes = list(file_sizes)
    if training_state is not None:
        sizes.append(_torch_save_bytes(training_state))
    sizes.append(_CHECKSUM_LINE_BYTES * (len(sizes) + 1))
    block = os.statvfs(parent).f_frsize or 4096
    return sum(_on_disk(size, block) for size in sizes) + 2 * block


def _on_disk(size: int, block: int) -> int:
    """The bytes a file of `size` bytes takes on a file system of `block`-byte blocks: its blocks, plus
    one per 512 of them and one more for the blocks that map them (indirect blocks, extent trees)."""
    blocks = -(-size // block)
    return (blocks + blocks // 512 + 1) * block


class _ByteCounter:
    """A write-only file that keeps nothing but the number of bytes written to it."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> int:
        n = memoryview(data).nbytes
        self.written += n
        return n


class _SizingPickler(pickle.Pickler):
    """Pickles an object as `torch.save` does (protocol 2, each storage replaced by an id naming it),
    collecting the storages, which `torch.save` writes as records beside the pickle."""

    def __init__(self, file: _ByteCounter):
        super().__init__(file, protocol=2)
        self.storages: dict[tuple, int] = {}  # one entry per storage torch.save would write: its bytes

    def persistent_id(self, obj: Any) -> tuple | None:
        if isinstance(obj, torch.storage.TypedStorage):
            obj = obj._untyped_storage  # what torch.save writes (`untyped()` warns of TypedStorage's removal)
        if not isinstance(obj, torch.UntypedStorage):
            return None
        nbytes = obj.nbytes()
        key = (obj.data_ptr(), nbytes, str(obj.device)) if nbytes else ("empty", len(self.storages))
        self.storages.setdefault(key, nbytes)
        # torch.save's id: ("storage", storage type, key, location, numel), a few bytes shorter than this.
        return ("storage", "UntypedStorage", str(len(self.storages)), str(obj.device), nbytes)


def _torch_save_bytes(obj: Any) -> int:
    """An upper bound of the size of the file `torch.save(obj, f)` writes, without writing it or copying
    any tensor: the pickle (with 8 bytes a storage of slack, although torch's own ids are shorter than
    `_SizingPickler`'s), the storages' bytes, and the archive's records."""
    counter = _ByteCounter()
    pickler = _SizingPickler(counter)
    pickler.dump(obj)
    records = len(pickler.storages) + 1  # and data.pkl
    data = counter.written + 8 * records + sum(pickler.storages.values())
    per_record = _ZIP_RECORD_BYTES + (_ZIP64_RECORD_BYTES if data >= 2**32 - 2**24 else 0)
    return data + records * per_record + _ZIP_FIXED_BYTES
