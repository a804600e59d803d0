"""Open Diffusion Policy's PushT zarr store read-only and check it (`open_pusht_zarr`), and read its arrays
with codec and IO failures turned into one `DatasetError` line (`read_array`).

A truncated copy is found here, before any conversion: zarr would silently fill a missing chunk with zeros.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lerobot.errors import DatasetError

# Arrays the conversion reads, with the trailing shape each must have (None: any size, e.g. image H/W).
REQUIRED_ARRAYS: dict[str, tuple[int | None, ...]] = {
    "data/img": (None, None, 3),
    "data/state": (5,),
    "data/action": (2,),
    "meta/episode_ends": (),
}


def open_pusht_zarr(path: Path) -> dict[str, Any]:
    """Open the PushT zarr read-only and check it; return {array name: zarr array}.

    Checks: the store opens, every required array exists with the expected trailing shape, all arrays have
    the same number of frames, every chunk is stored (zarr would silently fill missing chunks with zeros;
    writers skip chunks that are all fill value, but no real chunk of PushT images, states or actions is all
    zeros, so a missing one means a truncated copy), and `meta/episode_ends` increases strictly to the
    frame count.

    Raises:
        DatasetError: naming the store or array and the problem.
    """
    import zarr  # imported here: only conversion needs it, loading a converted dataset does not

    path = Path(path)
    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception as e:  # zarr raises several unrelated types for a bad store
        raise DatasetError(f"{path}: not a readable zarr store ({type(e).__name__}: {e})") from None
    arrays = {}
    for name, trailing in REQUIRED_ARRAYS.items():
        try:
            arr = group[name]
        except KeyError:
            raise DatasetError(
                f"{path}: missing array {name!r} (required: {sorted(REQUIRED_ARRAYS)})"
            ) from None
        except Exception as e:
            raise DatasetError(
                f"{path}/{name}: unreadable array metadata ({type(e).__name__}: {e})"
            ) from None
        if not hasattr(arr, "shape") or len(arr.shape) != 1 + len(trailing):
            raise DatasetError(
                f"{path}/{name}: expected {1 + len(trailing)} dimensions, got shape {arr.shape}"
            )
        if any(want is not None and got != want for want, got in zip(trailing, arr.shape[1:])):
            raise DatasetError(f"{path}/{name}: shape {arr.shape} does not end with {trailing}")
        if arr.nchunks_initialized != arr.nchunks:
            raise DatasetError(
                f"{path}/{name}: {arr.nchunks - arr.nchunks_initialized} of {arr.nchunks} chunks are missing "
                "(truncated copy?)"
            )
        arrays[name] = arr
    lengths = {name: arr.shape[0] for name, arr in arrays.items() if name.startswith("data/")}
    if len(set(lengths.values())) != 1:
        raise DatasetError(f"{path}: arrays have different numbers of frames: {lengths}")
    num_frames = next(iter(lengths.values()))
    ends = read_array(path, "meta/episode_ends", arrays["meta/episode_ends"])
    if not np.issubdtype(ends.dtype, np.integer):
        raise DatasetError(f"{path}/meta/episode_ends: expected integers, got {ends.dtype}")
    if len(ends) == 0 or ends[0] <= 0 or np.any(np.diff(ends) <= 0) or ends[-1] != num_frames:
        raise DatasetError(
            f"{path}/meta/episode_ends: must increase strictly from > 0 to the frame count {num_frames}; "
            f"got {len(ends)} ends, first {ends[:1].tolist()}, last {ends[-1:].tolist()}"
        )
    return arrays


def read_array(path: Path, name: str, arr: Any, sel: slice = slice(None)) -> np.ndarray:
    """Read `arr[sel]`, turning codec/IO failures into a `DatasetError` naming the array and frames."""
    try:
        return np.asarray(arr[sel])
    except Exception as e:
        where = "" if sel == slice(None) else f" frames {sel.start}..{sel.stop - 1}"
        raise DatasetError(
            f"{path}/{name}:{where} corrupt or truncated chunk ({type(e).__name__}: {e})"
        ) from None
