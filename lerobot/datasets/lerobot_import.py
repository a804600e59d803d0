"""Import a LeRobotDataset (v3.0 or v2.1, local or from the Hugging Face hub) into the project's format.

`dataset.format=lerobot` (implied by `dataset.repo_id=...`): `prepare_lerobot` finds the dataset directory,
converts it once into `<cache>/lerobot_datasets/<repo_id>/v1/` (the memory-mapped format of
`lerobot.datasets.format`, as the PushT zarr importer does) and returns that directory. Training then reads
numpy arrays: no video is decoded while training. The repo id names directories, so it must be a hub id
`<owner>/<name>` (`lerobot.config.check_repo_id`), and every directory derived from it lies under its root
(`repo_dir`): no id can make the conversion replace a directory elsewhere. Where the LeRobotDataset comes
from (`dataset.root`, LeRobot's home, the hub): `lerobot.datasets.lerobot_hub`.

Conversion, per episode: the parquet rows give the numeric features; the frame of each row is decoded from
the mp4 at `from_timestamp + timestamp` (v2.1: `timestamp`) within LeRobot's `tolerance_s` = 1e-4 s, or,
for a camera stored as images in the parquet files (`dtype: image`, LeRobot's `use_videos=False`), from
the row's PNG bytes. Row timestamps must be `frame_index / fps` within the same tolerance (the windows of
`delta_timestamps` count frames). Statistics are computed from the imported data exactly as for the zarr
(per-episode sums; camera frames of either storage alike), and the dataset's own min/max (`stats.json`, or
`episodes_stats.jsonl` for v2.1) must agree with the data.

With `dataset.image_size=[h, w]` every camera frame is resized to h x w as it is decoded (each pixel the mean
of the source pixels it covers: PIL's box filter), so a 480x480 recording for a 96x96 env converts to 1/25 of
the bytes; each size is its own conversion (`v1-96x96/`). The task table (LeRobot's `task_index` -> task
string) and the tasks of each episode are kept in `meta.json` (`tasks`, `episode_tasks`), from which
`make_dataset` derives a task feature the env declares and the dataset lacks (`factory.task_ids`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lerobot.config import DatasetConfig
from lerobot.constants import ACTION, ACTION_KIND, ENV_STATE, OBS_ENV_STATE, OBS_STATE, STATE, VISUAL
from lerobot.datasets.cache import default_cache_dir
from lerobot.datasets.conversion import write_conversion
from lerobot.datasets.format import (
    EPISODE_INDEX,
    FORMAT_VERSION,
    FRAME_INDEX,
    TIMESTAMP,
    combine_episode_stats,
    feature_file,
    open_preallocated_memmap,
    sufficient_stats,
    uint8_channel_stats,
    write_meta,
    write_stats,
)
from lerobot.datasets.lerobot_format import (
    LEGACY_EPISODES_STATS_PATH,
    STATS_PATH,
    TOLERANCE_S,
    V30,
    EpisodeRef,
    LeRobotSource,
    column_to_numpy,
    iter_episode_tables,
    open_lerobot_dataset,
    read_task_table,
)
from lerobot.datasets.lerobot_frames import decode_images_into, decode_video_into, resizing
from lerobot.datasets.lerobot_hub import find_lerobot_source, repo_dir
from lerobot.errors import ConfigError, DatasetError

log = logging.getLogger(__name__)

LEROBOT_FORMAT = "lerobot"
CONVERTED_NAME = f"v{FORMAT_VERSION}"
# Part of the fingerprint: bumped when the conversion's output changes, so existing imports are rebuilt.
# 2: meta.json holds the task table and each episode's tasks.
CONVERTER_REVISION = 2
# LeRobot's per-frame column pointing into its task table.
LEROBOT_TASK_INDEX = "task_index"
# Batch-key kinds of LeRobot's standard feature names (`observation.images.*` and videos are visual).
KINDS = {OBS_STATE: STATE, OBS_ENV_STATE: ENV_STATE, ACTION: ACTION_KIND}


def image_size_of(dataset_cfg: DatasetConfig) -> tuple[int, int] | None:
    """`dataset.image_size` as (height, width), or None; anything but two positive integers is a ConfigError."""
    size = dataset_cfg.image_size
    if size is None:
        return None
    values = list(size)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigError(
            f"dataset.image_size={values}: expected [height, width], two positive integers, or null"
        )
    return values[0], values[1]


def converted_dir(dataset_cfg: DatasetConfig, source: Path) -> Path:
    """`<cache>/lerobot_datasets/<repo_id>/v1` (`v1-<h>x<w>` with `dataset.image_size`); a `dataset.root`
    without a repo_id is keyed by its path.

    Raises:
        ConfigError: `dataset.repo_id` is no hub id `<owner>/<name>` (`repo_dir`).
    """
    cache = default_cache_dir(dataset_cfg) / "lerobot_datasets"
    if dataset_cfg.repo_id:
        converted = repo_dir(cache, dataset_cfg.repo_id)
    else:
        converted = cache / "local" / hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    size = image_size_of(dataset_cfg)
    return converted / (CONVERTED_NAME if size is None else f"{CONVERTED_NAME}-{size[0]}x{size[1]}")


def prepare_lerobot(dataset_cfg: DatasetConfig) -> Path:
    """The importer of `dataset.format=lerobot`: find the LeRobotDataset, convert it once, return the result."""
    source = find_lerobot_source(dataset_cfg)
    return convert_lerobot_dataset(
        source,
        converted_dir(dataset_cfg, source),
        name=dataset_cfg.repo_id,
        image_size=image_size_of(dataset_cfg),
    )


def source_fingerprint(source: LeRobotSource, image_size: tuple[int, int] | None = None) -> str:
    """sha256 of the converter revision, the frame size asked for, the metadata and parquet files (content)
    and the videos (name, size).

    Videos are identified by path and size only: hashing gigabytes of video on every start is not worth it.
    """
    digest = hashlib.sha256(f"lerobot-v{FORMAT_VERSION}-r{CONVERTER_REVISION}".encode())
    if image_size is not None:
        digest.update(f"image_size={image_size[0]}x{image_size[1]}".encode())
    root = source.root
    files = sorted(p for p in (root / "meta").rglob("*") if p.is_file())
    files += sorted({ep.data_path for ep in source.episodes})
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        # A missing file is named by the conversion (one line), not here.
        digest.update(path.read_bytes() if path.is_file() else b"missing")
    for path in sorted({v.path for ep in source.episodes for v in ep.videos.values()}):
        size = path.stat().st_size if path.is_file() else -1
        digest.update(f"{path.relative_to(root)}:{size}".encode())
    return digest.hexdigest()


def convert_lerobot_dataset(
    source_dir: Path | str,
    out_dir: Path | str,
    name: str | None = None,
    force: bool = False,
    image_size: tuple[int, int] | None = None,
) -> Path:
    """Convert the LeRobotDataset at `source_dir` into the project's format at `out_dir`; return `out_dir`.

    Idempotent (same fingerprint: nothing to do unless `force`) and atomic (written beside `out_dir`, renamed
    into place), like the PushT zarr conversion. `image_size` (height, width): resize every camera frame to
    it (see the module docstring); None keeps the recorded size.

    Raises:
        DatasetError: anything malformed, named in one line (see `lerobot.datasets.lerobot_format`).
    """
    out_dir = Path(out_dir)
    source = open_lerobot_dataset(source_dir)
    fingerprint = source_fingerprint(source, image_size)
    t0 = time.perf_counter()
    written = write_conversion(
        out_dir, fingerprint, converted_bytes(source, image_size),
        lambda tmp: _write_converted(source, tmp, fingerprint, name or source.root.name, image_size), force,
    )  # fmt: skip
    if written:
        log.info("imported %s -> %s in %.1f s", source.root, out_dir, time.perf_counter() - t0)
    return out_dir


def converted_bytes(source: LeRobotSource, image_size: tuple[int, int] | None = None) -> int:
    """Bytes the import writes: uint8 frames of the camera features plus 8 bytes per number per frame (a bound)."""
    cameras = [*source.video_keys, *source.image_keys]
    per_frame = sum(3 * int(np.prod(image_size or source.frame_shape(k))) for k in cameras)
    per_frame += 8 * sum(max(1, int(np.prod(source.features[k]["shape"]))) for k in source.numeric_keys) + 24
    return source.num_frames * per_frame


def _our_shape(source: LeRobotSource, key: str, image_size: tuple[int, int] | None = None) -> tuple[int, ...]:
    """The per-frame shape in the project's format: images (3, H, W) (H, W: `image_size` when given),
    scalars (), vectors (d,)."""
    if key in source.video_keys or key in source.image_keys:
        return (3, *(image_size or source.frame_shape(key)))
    shape = tuple(int(s) for s in source.features[key]["shape"])
    return () if shape == (1,) else shape


def _write_converted(
    source: LeRobotSource, out: Path, fingerprint: str, name: str, image_size: tuple[int, int] | None = None
) -> None:
    """Write the numeric arrays, the decoded frames, the statistics and (last) `meta.json` into `out`."""
    lengths = np.array([ep.length for ep in source.episodes], dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    keys = [*source.numeric_keys, *source.video_keys, *source.image_keys]
    shapes = {k: _our_shape(source, k, image_size) for k in keys}
    tasks = read_task_table(source)
    rows = _read_rows(source, out, shapes, starts, ends, tasks)
    arrays = _save_numeric(source, out, rows.values)
    episode_index = np.repeat(np.arange(len(lengths)), lengths).astype(np.int64)
    np.save(feature_file(out, EPISODE_INDEX), episode_index)
    np.save(feature_file(out, FRAME_INDEX), rows.frame_index)
    np.save(feature_file(out, TIMESTAMP), rows.timestamps.astype(np.float32))

    per_episode = {k: [sufficient_stats(a[s:e]) for s, e in zip(starts, ends)] for k, a in arrays.items()}
    per_episode.update(_camera_stats(source, out, rows, shapes, starts, ends))
    stacked, combined = combine_episode_stats(per_episode, len(lengths))
    _check_against_source_stats(source, combined, arrays)
    write_stats(out, stacked, combined)

    write_meta(
        out,
        name,
        source.fps,
        ends,
        _features(source, shapes, arrays),
        # LeRobot's task table (string of each task_index) and the task_index values of each episode.
        **({"tasks": tasks, "episode_tasks": rows.episode_tasks} if rows.episode_tasks is not None else {}),
        source={
            "format": LEROBOT_FORMAT,
            "path": str(source.root),
            "codebase_version": source.version,
            "fingerprint": fingerprint,
        },
    )


@dataclass
class _Rows:
    """What the parquet rows of every episode give (`_read_rows`).

    Attributes:
        values: each numeric feature's (T, *shape) arrays, one per episode.
        timestamps: (N,) float64 and `frame_index` (N,) int64: the rows' timing columns, over all frames.
        pixels_of: each camera stored as images: its (N, 3, H, W) uint8 `.npy`, memory-mapped, decoded.
        episode_tasks: the task_index values of each episode, None without a task table and column.
    """

    values: dict[str, list[np.ndarray]]
    timestamps: np.ndarray
    frame_index: np.ndarray
    pixels_of: dict[str, np.ndarray]
    episode_tasks: list[list[int]] | None


def _read_rows(
    source: LeRobotSource,
    out: Path,
    shapes: dict[str, tuple[int, ...]],
    starts: np.ndarray,
    ends: np.ndarray,
    tasks: list[str] | None,
) -> _Rows:
    """Read every episode's parquet rows once: check their timing, collect the numeric columns and the tasks,
    and decode the cameras stored as images into their `.npy` files in `out`."""
    numeric, images = source.numeric_keys, source.image_keys
    num_frames = int(ends[-1])
    task_column = [LEROBOT_TASK_INDEX] if tasks is not None and LEROBOT_TASK_INDEX in source.features else []
    rows = _Rows(
        values={k: [] for k in numeric},
        timestamps=np.empty(num_frames, dtype=np.float64),
        frame_index=np.empty(num_frames, dtype=np.int64),
        # Cameras stored as images are decoded from the rows as they are read.
        pixels_of={
            k: open_preallocated_memmap(feature_file(out, k), np.uint8, (num_frames, *shapes[k]))
            for k in images
        },
        episode_tasks=[] if task_column else None,
    )
    for ep, table in iter_episode_tables(
        source, [*numeric, *images, *task_column, "timestamp", "frame_index"]
    ):
        lo, hi = int(starts[ep.index]), int(ends[ep.index])
        path = ep.data_path
        rows.frame_index[lo:hi], rows.timestamps[lo:hi] = _episode_timing(table, ep, source.fps)
        for key in numeric:
            rows.values[key].append(
                column_to_numpy(table, key, shapes[key] or (1,), path).reshape(ep.length, *shapes[key])
            )
        for key in images:
            dest = resizing(rows.pixels_of[key], source.frame_shape(key))
            decode_images_into(table, key, dest, np.arange(lo, hi), path, ep.index)
        if task_column:
            ids = column_to_numpy(table, LEROBOT_TASK_INDEX, (), path).astype(np.int64)
            rows.episode_tasks.append(_episode_tasks(ids, len(tasks), path, ep.index))
    return rows


def _episode_timing(table: pa.Table, ep: EpisodeRef, fps: int) -> tuple[np.ndarray, np.ndarray]:
    """`(frame_index, timestamp)` of one episode's rows, checked: frames 0..T-1 in order, each row at
    `frame_index / fps` within `TOLERANCE_S` (the windows of `delta_timestamps` count frames)."""
    path = ep.data_path
    frames = column_to_numpy(table, "frame_index", (), path).astype(np.int64)
    ts = column_to_numpy(table, "timestamp", (), path).astype(np.float64)
    if not np.array_equal(frames, np.arange(ep.length)):
        raise DatasetError(f"{path}: episode {ep.index}: frame_index is not 0..{ep.length - 1} in order")
    off = np.abs(ts - frames / fps)
    if off.max(initial=0.0) > TOLERANCE_S:
        bad = int(np.argmax(off))
        raise DatasetError(
            f"{path}: episode {ep.index} frame {bad}: timestamp {ts[bad]:.6f} s is not frame_index / fps = "
            f"{bad / fps:.6f} s (tolerance {TOLERANCE_S:g} s); the recording is not at a constant {fps} fps"
        )
    return frames, ts


def _save_numeric(
    source: LeRobotSource, out: Path, values: dict[str, list[np.ndarray]]
) -> dict[str, np.ndarray]:
    """Each numeric feature's episodes concatenated and saved as `<key>.npy` (float64 as float32); returned.

    Raises:
        DatasetError: a float feature holds NaN or infinite values.
    """
    arrays = {k: np.concatenate(v) for k, v in values.items()}
    for key, arr in arrays.items():
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise DatasetError(f"{source.root}: feature {key!r} holds NaN or infinite values")
        if arr.dtype == np.float64:
            arrays[key] = arr.astype(np.float32)
        np.save(feature_file(out, key), arrays[key])
    return arrays


def _camera_stats(
    source: LeRobotSource,
    out: Path,
    rows: _Rows,
    shapes: dict[str, tuple[int, ...]],
    starts: np.ndarray,
    ends: np.ndarray,
) -> dict[str, list[dict[str, np.ndarray]]]:
    """Each camera's per-episode `uint8_channel_stats`, once its frames are all in `out`: the videos are
    decoded here, the images (decoded with the rows) are flushed."""
    per_episode = {}
    for key in [*source.video_keys, *source.image_keys]:
        if key in source.video_keys:
            pixels = _decode_feature(source, key, out, rows.timestamps, starts, int(ends[-1]), shapes[key])
        else:
            pixels = rows.pixels_of.pop(key)
            pixels.flush()
        per_episode[key] = [uint8_channel_stats(pixels[s:e]) for s, e in zip(starts, ends)]
        del pixels
    return per_episode


def _features(
    source: LeRobotSource, shapes: dict[str, tuple[int, ...]], arrays: dict[str, np.ndarray]
) -> dict[str, dict[str, Any]]:
    """`meta.json`'s features: the cameras, the numeric arrays, then the bookkeeping columns."""
    features: dict[str, dict[str, Any]] = {
        k: {"shape": list(shapes[k]), "dtype": "uint8", "kind": VISUAL}
        for k in [*source.video_keys, *source.image_keys]
    }
    for key, arr in arrays.items():
        features[key] = {"shape": list(shapes[key]), "dtype": str(arr.dtype), "kind": KINDS.get(key, "other")}
    for key, dtype in ((EPISODE_INDEX, "int64"), (FRAME_INDEX, "int64"), (TIMESTAMP, "float32")):
        features[key] = {"shape": [], "dtype": dtype, "kind": "other"}
    return features


def _decode_feature(
    source: LeRobotSource,
    key: str,
    out: Path,
    timestamps: np.ndarray,
    starts: np.ndarray,
    num_frames: int,
    shape: tuple[int, ...],
) -> np.ndarray:
    """Decode every frame of video feature `key` into `<key>.npy` (N, 3, H, W) uint8, one pass per mp4."""
    dest = open_preallocated_memmap(feature_file(out, key), np.uint8, (num_frames, *shape))
    frames = resizing(dest, source.frame_shape(key))
    by_file: dict[Path, list[tuple[np.ndarray, np.ndarray]]] = {}
    for ep in source.episodes:
        ref = ep.videos[key]
        rows = np.arange(starts[ep.index], starts[ep.index] + ep.length)
        by_file.setdefault(ref.path, []).append((ref.from_timestamp + timestamps[rows], rows))
    for path, parts in by_file.items():
        decode_video_into(
            path, np.concatenate([t for t, _ in parts]), frames, np.concatenate([r for _, r in parts])
        )
    dest.flush()
    return dest


def _episode_tasks(ids: np.ndarray, num_tasks: int, path: Path, episode: int) -> list[int]:
    """The distinct task_index values (in order of first appearance) of one episode's rows `ids` (frames,)."""
    bad = ids[(ids < 0) | (ids >= num_tasks)]
    if bad.size:
        raise DatasetError(
            f"{path}: episode {episode}: task_index {int(bad[0])} is not in the task table (0..{num_tasks - 1})"
        )
    distinct, first = np.unique(ids, return_index=True)
    return [int(t) for t in distinct[np.argsort(first)]]


def _check_against_source_stats(
    source: LeRobotSource, combined: dict[str, dict[str, np.ndarray]], arrays: dict[str, np.ndarray]
) -> None:
    """The dataset's stored min/max of each non-boolean numeric feature must match the data (they are exact)."""
    stats_file = source.root / (STATS_PATH if source.version == V30 else LEGACY_EPISODES_STATS_PATH)
    for key, arr in arrays.items():
        if arr.dtype == np.bool_:
            continue
        stored = source.stats.get(key)
        if stored is None or "min" not in stored or "max" not in stored:
            raise DatasetError(f"{stats_file}: no min/max for feature {key!r}; the statistics are incomplete")
        for name in ("min", "max"):
            want, got = np.asarray(stored[name]).reshape(-1), np.asarray(combined[key][name]).reshape(-1)
            scale = np.maximum(np.abs(got), 1.0)
            if want.shape != got.shape or np.any(np.abs(want - got) > 1e-5 * scale):
                raise DatasetError(
                    f"{stats_file}: {key} {name} is {want.tolist()[:4]} but the data gives {got.tolist()[:4]}; "
                    "the statistics and the data files do not belong together (copy or download it again)"
                )
