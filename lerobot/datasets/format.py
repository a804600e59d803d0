"""The project's on-disk dataset format: file names, metadata, errors and per-episode statistics.

A converted dataset is one directory (e.g. `~/.cache/lerobot/pusht/v1/`):

    meta.json                        fps, frame/episode counts, episode boundaries, features, source
    <feature>.npy                    one contiguous array per feature, frames along axis 0 (memory-mappable)
    episode_stats.safetensors        per-episode sufficient statistics (count, sum, sum of squares, min, max)
    stats.json                       mean/std/min/max over all episodes, for people to read

`meta.json` is written last and the directory is renamed into place in one step, so a directory with a
`meta.json` is always complete. Statistics for any subset of episodes (e.g. the training split) are combined
exactly from the per-episode sums, so the split can be chosen at load time without re-reading the data.

The per-episode min/max double as a fingerprint of the numeric arrays: `check_against_episode_stats` finds a
value changed after conversion (NaN, 1e30) in milliseconds when a dataset is opened. Writers call
`check_free_space` before writing and create large arrays with `open_preallocated_memmap`, so a full disk is
an `OSError` (turned into one line by `out_of_space_error`) instead of a SIGBUS while pages are written back.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from lerobot.errors import DatasetError, DatasetNotFoundError
from lerobot.runtime.files import NO_SPACE_ERRNOS, write_json

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
EPISODE_STATS_FILE = "episode_stats.safetensors"
STATS_FILE = "stats.json"

# Per-frame bookkeeping arrays, stored beside the features but not features themselves.
EPISODE_INDEX = "episode_index"
FRAME_INDEX = "frame_index"
TIMESTAMP = "timestamp"
BOOKKEEPING_KEYS = (EPISODE_INDEX, FRAME_INDEX, TIMESTAMP)

STAT_NAMES = ("mean", "std", "min", "max")
_SUFFICIENT = ("count", "sum", "sumsq", "min", "max")

# errno values of a write that failed for lack of room (full disk, quota, file-size limit).


def feature_file(root: Path, key: str) -> Path:
    """Path of the `.npy` array holding feature `key` under a converted dataset `root`."""
    return Path(root) / f"{key}.npy"


def read_meta(root: Path) -> dict[str, Any]:
    """Load and check `meta.json` of a converted dataset; raise `DatasetError` naming the file if bad."""
    path = Path(root) / META_FILE
    if not path.is_file():
        raise DatasetNotFoundError(f"{path}: not found; {root} is not a converted dataset (no {META_FILE})")
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable metadata ({e})") from None
    missing = [
        k for k in ("format_version", "fps", "num_frames", "episode_ends", "features") if k not in meta
    ]
    if missing:
        raise DatasetError(f"{path}: metadata lacks {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise DatasetError(
            f"{path}: format version {meta['format_version']}, this code reads version {FORMAT_VERSION}; "
            "delete the directory to convert again"
        )
    ends = np.asarray(meta["episode_ends"], dtype=np.int64)
    if ends.ndim != 1 or len(ends) == 0 or ends[-1] != meta["num_frames"] or np.any(np.diff(ends) <= 0):
        raise DatasetError(f"{path}: episode_ends must increase strictly and end at num_frames")
    return meta


def load_episode_stats(root: Path) -> dict[str, np.ndarray]:
    """Read `episode_stats.safetensors` of a converted dataset: {"<feature>/<count|sum|...>": (E, ...)}.

    Raises:
        DatasetError: the file is missing, truncated or corrupt (one line naming it and the fix).
    """
    path = Path(root) / EPISODE_STATS_FILE
    try:
        return load_file(path)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise DatasetError(
            f"{path}: unreadable statistics ({type(e).__name__}: {e}); delete {root} to convert again"
        ) from None


def check_against_episode_stats(
    path: Path, values: np.ndarray, episode_stats: dict[str, np.ndarray], episode_ends: np.ndarray, root: Path
) -> None:
    """Raise `DatasetError` unless every value lies within its episode's min/max recorded at conversion.

    Catches a numeric array modified or damaged after conversion (NaN, inf, 1e30 written into `action.npy`)
    before it reaches training; the min/max are the data's own extremes, so no tolerance is needed.
    One pass of per-episode min/max over the (memory-mapped) array; only a failing episode is searched.

    Args:
        path: the array's file, for the message.
        values: (N, *shape) the feature over all frames, episodes one after another.
        episode_stats: {"min", "max"}: (E, *shape) per-episode extremes of this feature.
        episode_ends: (E,) exclusive end frame of each episode.
        root: the converted dataset's directory, named in the fix.
    """
    starts = np.concatenate([[0], episode_ends[:-1]]).astype(np.int64)
    # In the array's own dtype: rounding is monotonic, so extremes an importer took before casting its data
    # (e.g. float64 source -> float32 array) round to exactly the stored array's extremes.
    lows, highs = (episode_stats[name].astype(values.dtype) for name in ("min", "max"))
    # NaN propagates through minimum/maximum and fails both comparisons.
    inside = (np.minimum.reduceat(values, starts, axis=0) >= lows) & (
        np.maximum.reduceat(values, starts, axis=0) <= highs
    )
    if inside.all():
        return
    episode = int(np.argmin(inside.reshape(len(starts), -1).all(axis=1)))
    start, end = int(starts[episode]), int(episode_ends[episode])
    frames = np.asarray(values[start:end]).reshape(end - start, -1)
    low, high = lows[episode].reshape(-1), highs[episode].reshape(-1)
    frame, col = np.argwhere(~((frames >= low) & (frames <= high)))[0]
    raise DatasetError(
        f"{path}: episode {episode} frame {frame} (row {start + frame}) holds {frames[frame, col]:.6g}, outside "
        f"the range [{low[col]:.6g}, {high[col]:.6g}] recorded at conversion (changed or damaged since); "
        f"delete {root} to convert again"
    )


def check_free_space(directory: Path, needed_bytes: int) -> None:
    """Raise `DatasetError` if the disk holding `directory` has less than `needed_bytes` free."""
    free = shutil.disk_usage(directory).free
    if free < needed_bytes:
        raise DatasetError(_space_message(directory, needed_bytes, free, "not enough disk space"))


def out_of_space_error(error: OSError, directory: Path, needed_bytes: int) -> DatasetError | None:
    """The one-line `DatasetError` for a write that failed for lack of room, else None (another OSError)."""
    if error.errno not in NO_SPACE_ERRNOS:
        return None
    free = shutil.disk_usage(directory).free
    return DatasetError(_space_message(directory, needed_bytes, free, f"ran out of space ({error.strerror})"))


def _space_message(directory: Path, needed: int, free: int, problem: str) -> str:
    return (
        f"{directory}: {problem} while converting the dataset: it needs {needed / 1e6:.1f} MB there, "
        f"{free / 1e6:.1f} MB are free; free some space or set dataset.cache_dir to a disk with room"
    )


def open_preallocated_memmap(path: Path, dtype: np.dtype | type, shape: tuple[int, ...]) -> np.memmap:
    """A writable `.npy` memory map whose blocks are reserved on disk before any page is written.

    `open_memmap` alone makes a sparse file: on a full disk the kernel finds out only when it writes a dirty
    page back, and the process dies of SIGBUS. Reserving the blocks up front turns that into an `OSError`
    (ENOSPC, or EFBIG under a file-size limit) here.
    """
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:  # it names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
    return array


def sufficient_stats(values: np.ndarray, channel_axis: int | None = None) -> dict[str, np.ndarray]:
    """Count, sum, sum of squares, min and max of `values` (frames on axis 0), in float64.

    Args:
        values: (n, *shape) array of one episode's frames.
        channel_axis: for images, the axis (of `values`) that holds channels; statistics are then per
            channel, shape (C,), reducing over frames and pixels. Otherwise they have the feature's shape.
    """
    x = np.asarray(values, dtype=np.float64)
    if channel_axis is None:
        axes: tuple[int, ...] = (0,)
    else:
        axes = tuple(a for a in range(x.ndim) if a != channel_axis)
    count = np.prod([x.shape[a] for a in axes])
    return {
        "count": np.array(count, dtype=np.float64),
        "sum": x.sum(axis=axes),
        "sumsq": np.square(x).sum(axis=axes),
        "min": x.min(axis=axes),
        "max": x.max(axis=axes),
    }


def uint8_channel_stats(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel sufficient statistics of uint8 images (n, C, H, W) in the [0, 1] scale (`value / 255`).

    Uses one 256-bin histogram per channel instead of float conversion: exact and several times faster.
    """
    n, c = images.shape[:2]
    levels = np.arange(256, dtype=np.float64) / 255.0
    hist = np.stack([np.bincount(images[:, ch].ravel(), minlength=256) for ch in range(c)]).astype(np.float64)
    present = hist > 0
    return {
        "count": np.array(hist[0].sum(), dtype=np.float64),
        "sum": hist @ levels,
        "sumsq": hist @ np.square(levels),
        "min": np.array([levels[np.argmax(p)] for p in present]),
        "max": np.array([levels[255 - np.argmax(p[::-1])] for p in present]),
    }


def stack_episode_stats(per_episode: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """List over episodes of `sufficient_stats` dicts -> dict of arrays with a leading episode axis."""
    return {name: np.stack([ep[name] for ep in per_episode]) for name in _SUFFICIENT}


def combine_stats(
    episode_stats: dict[str, np.ndarray], episodes: Sequence[int] | np.ndarray
) -> dict[str, np.ndarray]:
    """Mean, std (population, ddof=0), min, max over the frames of `episodes`, from per-episode sums.

    Args:
        episode_stats: {"count": (E,), "sum"/"sumsq"/"min"/"max": (E, *shape)} float64.
        episodes: indices into the episode axis.

    Returns:
        {"mean", "std", "min", "max"} float64 arrays of the feature's statistics shape.
    """
    idx = np.asarray(episodes, dtype=np.int64)
    if len(idx) == 0:
        raise ValueError("cannot compute statistics over zero episodes")
    count = episode_stats["count"][idx].sum()
    mean = episode_stats["sum"][idx].sum(0) / count
    # E[x^2] - E[x]^2 in float64; the features here have |mean| / std of at most a few, so the
    # cancellation costs well under 1e-9 relative precision. Clip tiny negatives from rounding.
    var = np.maximum(episode_stats["sumsq"][idx].sum(0) / count - np.square(mean), 0.0)
    return {
        "mean": mean,
        "std": np.sqrt(var),
        "min": episode_stats["min"][idx].min(0),
        "max": episode_stats["max"][idx].max(0),
    }


def stats_to_tensors(stats: dict[str, np.ndarray], image: bool) -> dict[str, torch.Tensor]:
    """float64 statistics -> float32 tensors; image statistics get shape (C, 1, 1) to broadcast on (C, H, W)."""
    out = {}
    for name in STAT_NAMES:
        t = torch.as_tensor(np.asarray(stats[name]), dtype=torch.float32)
        out[name] = t.reshape(-1, 1, 1) if image else t
    return out


# ---------------------------------------------------------------- writing a conversion (any importer)


def combine_episode_stats(
    per_episode: dict[str, list[dict[str, np.ndarray]]], num_episodes: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
    """`(stacked, combined)` statistics of a conversion from each feature's `num_episodes` per-episode
    `sufficient_stats`: stacked along an episode axis (`stack_episode_stats`), and combined over every episode
    (`combine_stats`)."""
    stacked = {key: stack_episode_stats(episodes) for key, episodes in per_episode.items()}
    everything = np.arange(num_episodes)
    return stacked, {key: combine_stats(st, everything) for key, st in stacked.items()}


def write_stats(
    out: Path, stacked: dict[str, dict[str, np.ndarray]], combined: dict[str, dict[str, np.ndarray]]
) -> None:
    """Write a conversion's `episode_stats.safetensors` (the `stacked` per-episode sums) and `stats.json` (the
    `combined` statistics, for people to read) into `out`."""
    save_file(
        {f"{key}/{name}": a for key, st in stacked.items() for name, a in st.items()},
        out / EPISODE_STATS_FILE,
    )
    readable = {key: {name: v.tolist() for name, v in st.items()} for key, st in combined.items()}
    write_json(out / STATS_FILE, readable, indent=1, fsync=True)


def write_meta(
    out: Path, name: str, fps: int, ends: np.ndarray, features: dict[str, Any], **more: Any
) -> None:
    """Write a conversion's `meta.json`, last (a directory with one is complete): the format version, `name`,
    `fps`, the frame and episode counts, the episodes' (exclusive) `ends`, the `features`, then `more` (the
    source, notes)."""
    meta = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "fps": fps,
        "num_frames": int(ends[-1]),
        "num_episodes": len(ends),
        "episode_ends": ends.tolist(),
        "features": features,
        **more,
    }
    write_json(out / META_FILE, meta, indent=1, fsync=True)
