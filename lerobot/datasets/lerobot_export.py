"""Write a converted dataset of this project (e.g. the PushT demonstrations) as a LeRobotDataset v3.0.

    export_lerobot_dataset(converted_dir, out_dir, task="Push the T-shaped block onto the T-shaped target.")

What is written (the layout LeRobot 0.4-0.6 reads; see `lerobot.datasets.lerobot_format`):

- `data/chunk-000/file-NNN.parquet`: one row per frame, vectors as fixed-size lists (`list<float>[n]`),
  scalars as plain columns, plus `timestamp` (frame_index / fps), `frame_index`, `episode_index`, `index`,
  `task_index`; one row group per episode.
- `videos/<key>/chunk-000/file-NNN.mp4` per image feature: AV1 (libsvtav1, yuv420p, GOP 2, CRF 30: LeRobot's
  defaults), the episodes of a file back to back, frame `i` of the file at `i / fps` seconds.
- `meta/info.json` (codebase_version "v3.0", features, path templates), `meta/stats.json` (min, max, mean,
  std, count per feature; images per channel (3, 1, 1) in [0, 1]), `meta/tasks.parquet` (task string as the
  pandas index, `task_index`), `meta/episodes/chunk-000/file-000.parquet` (per episode: length, tasks, data and
  video file indices, `dataset_{from,to}_index`, `videos/<key>/{from,to}_timestamp`, `stats/<key>/<stat>`).

Statistics come exactly from the per-episode sums of the converted dataset. The directory is written beside
`out_dir` (`.<name>.tmp-*`, locked by its writer: `lerobot.runtime.files.TemporaryDir`) and renamed into
place at the end, so an interrupted export leaves nothing that looks finished; the next export into the same
`out_dir` deletes what a killed one left (and leaves a running one's alone).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot.constants import VISUAL
from lerobot.datasets.format import (
    BOOKKEEPING_KEYS,
    combine_stats,
    feature_file,
    load_episode_stats,
    read_meta,
)
from lerobot.datasets.lerobot_format import (
    DATA_PATH,
    EPISODES_PATH,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    V30,
    VIDEO_PATH,
)
from lerobot.errors import DatasetError, DatasetExistsError
from lerobot.runtime.files import TemporaryDir, remove_stale_temporary_dirs, write_json

log = logging.getLogger(__name__)

# LeRobot's default number of files per chunk directory and file size limits (written into info.json).
CHUNKS_SIZE = 1000
DATA_FILES_SIZE_IN_MB = 100
VIDEO_FILES_SIZE_IN_MB = 200


@dataclass(frozen=True)
class VideoEncoding:
    """Encoder settings; the defaults are LeRobot's (`VideoEncoderConfig`): AV1, yuv420p, GOP 2, CRF 30."""

    codec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    g: int = 2
    crf: int = 30
    preset: int = 12

    def options(self) -> dict[str, str]:
        """Codec options for PyAV's `add_stream`."""
        return {"g": str(self.g), "crf": str(self.crf), "preset": str(self.preset)}


def encode_video(
    path: Path, blocks: Iterable[np.ndarray], fps: int, encoding: VideoEncoding = VideoEncoding()
) -> int:
    """Encode uint8 frames into an mp4 at `path`; frame `i` is presented at `i / fps` s. Returns the frame count.

    Args:
        path: output file.
        blocks: arrays of frames (n, 3, H, W) uint8, e.g. one per episode; all of the same H, W.
        fps: frame rate.
        encoding: codec and settings.
    """
    import av  # imported here: only exporting encodes video

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration otherwise
    # SVT-AV1 switches the calling thread to real-time scheduling (SCHED_FIFO, when allowed, e.g. as root),
    # which every process started afterwards inherits and which starves the machine: put it back.
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        count = _encode(av, path, blocks, fps, encoding)
    finally:
        if os.sched_getscheduler(0) != policy:
            os.sched_setscheduler(0, policy, param)
    return count


def _encode(av: Any, path: Path, blocks: Iterable[np.ndarray], fps: int, encoding: VideoEncoding) -> int:
    """`encode_video`'s work: one stream, frames numbered from 0 at 1 / fps."""
    count = 0
    with av.open(str(path), "w") as container:
        stream = None
        for block in blocks:
            if stream is None:
                stream = container.add_stream(encoding.codec, rate=fps, options=encoding.options())
                stream.pix_fmt = encoding.pix_fmt
                stream.height, stream.width = block.shape[2:]
                stream.time_base = Fraction(1, fps)
            for image in block:
                frame = av.VideoFrame.from_ndarray(
                    np.ascontiguousarray(image.transpose(1, 2, 0)), format="rgb24"
                )
                frame.pts, frame.time_base = count, Fraction(1, fps)
                container.mux(stream.encode(frame))
                count += 1
        if stream is not None:
            container.mux(stream.encode())
    return count


def tasks_table(tasks: list[str]) -> pa.Table:
    """`meta/tasks.parquet` as LeRobot writes it with pandas: the task string is the (named) index."""
    table = pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())}
    )
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def lerobot_stats(st: dict[str, np.ndarray], count: int, image: bool) -> dict[str, Any]:
    """{"min", "max", "mean", "std"} (+ "count") as LeRobot stores them: images (C, 1, 1), vectors (n,), scalars (1,)."""
    out: dict[str, Any] = {}
    for name in ("min", "max", "mean", "std"):
        value = np.asarray(st[name], dtype=np.float64)
        out[name] = (value.reshape(-1, 1, 1) if image else value.reshape(-1)).tolist()
    out["count"] = [int(count)]
    return out


def export_lerobot_dataset(
    converted_dir: Path | str,
    out_dir: Path | str,
    task: str | list[str] | None = None,
    episodes_per_file: int | None = None,
    encoding: VideoEncoding = VideoEncoding(),
    overwrite: bool = False,
) -> Path:
    """Write the converted dataset at `converted_dir` as a LeRobotDataset v3.0 at `out_dir`; return `out_dir`.

    Args:
        converted_dir: a dataset in this project's format (holds `meta.json`), e.g. `<cache>/pusht/v1`.
        out_dir: the LeRobotDataset directory to create.
        task: the task string of every episode (default: the dataset's name), or one per episode (the
            tasks table lists them in order of first appearance; `task_index` points into it).
        episodes_per_file: episodes per data parquet / mp4 file (default: all in one file, as LeRobot does
            below its 100 MB / 200 MB file limits).
        encoding: video codec settings (default: LeRobot's AV1 settings).
        overwrite: replace an existing `out_dir`.

    Raises:
        DatasetExistsError: `out_dir` exists (without `overwrite`), before the export or made by another
            writer while this one wrote (that one's directory is kept).
        DatasetError: a feature has a shape LeRobot cannot store.
    """
    src, out_dir = Path(converted_dir), Path(out_dir)
    removed, freed = remove_stale_temporary_dirs(out_dir)
    if removed:
        log.info(
            "removed %d unfinished export(s) of %s left by killed exports (%.1f MB)",
            removed,
            out_dir,
            freed / 1e6,
        )
    meta = read_meta(src)
    task = task or meta.get("name", "task")
    exists = f"{out_dir}: already exists; choose another directory or pass overwrite (--overwrite)"
    if out_dir.exists() and not overwrite:
        raise DatasetExistsError(exists)
    fps, ends = int(meta["fps"]), np.asarray(meta["episode_ends"], dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]])
    num_episodes = len(ends)
    episode_tasks, tasks, frame_task_index = _task_indices(task, starts, ends)
    per_file = episodes_per_file or num_episodes
    if per_file < 1:
        raise DatasetError(f"episodes_per_file={episodes_per_file} must be >= 1")
    features, video_keys, numeric_keys = _exported_features(src, meta)
    arrays = {k: np.load(feature_file(src, k), mmap_mode="r") for k in [*features, *BOOKKEEPING_KEYS]}
    episode_stats = load_episode_stats(src)
    file_of = np.arange(num_episodes) // per_file

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with TemporaryDir(out_dir) as writing:
        tmp = writing.path
        _write_data(tmp, arrays, numeric_keys, features, starts, ends, file_of, frame_task_index)
        for key in video_keys:
            _write_videos(tmp, key, arrays[key], starts, ends, file_of, fps, encoding)
        stats_of = {
            k: {n: episode_stats[f"{k}/{n}"] for n in ("count", "sum", "sumsq", "min", "max")}
            for k in features
        }
        _write_episodes(tmp, episode_tasks, features, video_keys, stats_of, starts, ends, file_of, fps)
        (tmp / "meta").mkdir(exist_ok=True)
        total = _total_stats(stats_of, video_keys, arrays, ends, frame_task_index)
        write_json(tmp / STATS_PATH, total, indent=1, fsync=True)
        pq.write_table(tasks_table(tasks), tmp / TASKS_PATH)
        info = _info(num_episodes, int(ends[-1]), len(tasks), fps, features, video_keys, encoding)
        write_json(tmp / INFO_PATH, info, indent=1, fsync=True)
        try:
            writing.install(replace=overwrite)
        except FileExistsError:  # another writer made `out_dir` meanwhile
            raise DatasetExistsError(exists) from None
    return out_dir


def _task_indices(
    task: str | list[str], starts: np.ndarray, ends: np.ndarray
) -> tuple[list[str], list[str], np.ndarray]:
    """`(the task of each episode, the tasks table, the task_index of each frame)` for `task`, one string for
    every episode or one per episode; the table lists the tasks in order of first appearance."""
    num_episodes = len(ends)
    episode_tasks = [task] * num_episodes if isinstance(task, str) else list(task)
    if len(episode_tasks) != num_episodes:
        raise DatasetError(f"{len(episode_tasks)} task strings for {num_episodes} episodes")
    tasks = list(dict.fromkeys(episode_tasks))
    episode_task_index = np.array([tasks.index(t) for t in episode_tasks], dtype=np.int64)
    return episode_tasks, tasks, np.repeat(episode_task_index, ends - starts)


def _exported_features(src: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """`(features, video keys, numeric keys)` of the converted dataset at `src` (bookkeeping left out): the
    visual features become videos, the others parquet columns, which hold scalars and vectors only."""
    features = {k: v for k, v in meta["features"].items() if k not in BOOKKEEPING_KEYS}
    video_keys = [k for k, v in features.items() if v.get("kind") == VISUAL]
    numeric_keys = [k for k in features if k not in video_keys]
    for key in numeric_keys:
        if len(features[key]["shape"]) > 1:
            raise DatasetError(
                f"{src}: feature {key!r} has shape {features[key]['shape']}; only scalars and vectors export"
            )
    return features, video_keys, numeric_keys


def _write_videos(
    out: Path,
    key: str,
    frames: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    file_of: np.ndarray,
    fps: int,
    encoding: VideoEncoding,
) -> None:
    """One mp4 of video feature `key` per group of episodes (`file_of`), their `frames` back to back."""
    for f in range(int(file_of[-1]) + 1):
        path = out / VIDEO_PATH.format(
            video_key=key, chunk_index=f // CHUNKS_SIZE, file_index=f % CHUNKS_SIZE
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        eps = np.flatnonzero(file_of == f)
        encode_video(path, (frames[starts[e] : ends[e]] for e in eps), fps, encoding)


def _total_stats(
    stats_of: dict[str, dict[str, np.ndarray]],
    video_keys: list[str],
    arrays: dict[str, np.ndarray],
    ends: np.ndarray,
    task_index: np.ndarray,
) -> dict[str, dict[str, Any]]:
    """`meta/stats.json`: each feature's statistics over every episode (from the per-episode sums
    `stats_of`), then those of LeRobot's bookkeeping columns."""
    num_frames = int(ends[-1])
    everything = np.arange(len(ends))
    total = {
        k: lerobot_stats(combine_stats(st, everything), num_frames, k in video_keys)
        for k, st in stats_of.items()
    }
    for key, values in _bookkeeping_columns(arrays, ends, task_index).items():
        total[key] = lerobot_stats(_plain_stats(values), num_frames, image=False)
    return total


def _info(
    num_episodes: int,
    num_frames: int,
    num_tasks: int,
    fps: int,
    features: dict[str, Any],
    video_keys: list[str],
    encoding: VideoEncoding,
) -> dict[str, Any]:
    """`meta/info.json`: the dataset's sizes, LeRobot's file layout and the features."""
    return {
        "codebase_version": V30,
        "robot_type": None,
        "total_episodes": num_episodes,
        "total_frames": num_frames,
        "total_tasks": num_tasks,
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
        "fps": fps,
        "splits": {"train": f"0:{num_episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if video_keys else None,
        "features": _info_features(features, video_keys, fps, encoding),
    }


def _plain_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """min, max, mean, std (population) of (n, ...) values over frames."""
    x = np.asarray(values, dtype=np.float64)
    return {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}


def _bookkeeping_columns(
    arrays: dict[str, np.ndarray], ends: np.ndarray, task_index: np.ndarray
) -> dict[str, np.ndarray]:
    """LeRobot's per-frame columns: timestamp, frame_index, episode_index, global index, task_index (into the
    tasks table)."""
    num_frames = int(ends[-1])
    return {
        "timestamp": np.asarray(arrays["timestamp"], dtype=np.float32),
        "frame_index": np.asarray(arrays["frame_index"], dtype=np.int64),
        "episode_index": np.asarray(arrays["episode_index"], dtype=np.int64),
        "index": np.arange(num_frames, dtype=np.int64),
        "task_index": task_index,
    }


def _arrow_column(values: np.ndarray) -> pa.Array:
    """(n,) -> a plain column; (n, d) -> a fixed-size list column `list<type>[d]` (what LeRobot's loader casts to)."""
    if values.ndim == 1:
        return pa.array(values)
    return pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(values).reshape(-1)), values.shape[1]
    )


def _write_data(
    out: Path,
    arrays: dict[str, np.ndarray],
    numeric_keys: list[str],
    features: dict[str, Any],
    starts: np.ndarray,
    ends: np.ndarray,
    file_of: np.ndarray,
    task_index: np.ndarray,
) -> None:
    """One parquet file per group of episodes, one row group per episode; `task_index` (frames,) per frame."""
    bookkeeping = _bookkeeping_columns(arrays, ends, task_index)
    for f in range(int(file_of[-1]) + 1):
        eps = np.flatnonzero(file_of == f)
        lo, hi = int(starts[eps[0]]), int(ends[eps[-1]])
        columns = {k: _arrow_column(np.asarray(arrays[k][lo:hi])) for k in numeric_keys}
        columns.update({k: _arrow_column(v[lo:hi]) for k, v in bookkeeping.items()})
        table = pa.table(columns)
        path = out / DATA_PATH.format(chunk_index=f // CHUNKS_SIZE, file_index=f % CHUNKS_SIZE)
        path.parent.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(path, table.schema, compression="snappy") as writer:
            for e in eps:
                writer.write_table(table.slice(int(starts[e]) - lo, int(ends[e] - starts[e])))


def _write_episodes(
    out: Path,
    tasks: list[str],
    features: dict[str, Any],
    video_keys: list[str],
    stats_of: dict[str, dict[str, np.ndarray]],
    starts: np.ndarray,
    ends: np.ndarray,
    file_of: np.ndarray,
    fps: int,
) -> None:
    """`meta/episodes/chunk-000/file-000.parquet`: one row per episode (see the module docstring)."""
    num_episodes = len(ends)
    first_of_file = {int(f): int(starts[np.flatnonzero(file_of == f)[0]]) for f in np.unique(file_of)}
    in_file = np.array([starts[e] - first_of_file[int(file_of[e])] for e in range(num_episodes)])
    columns: dict[str, Any] = {
        "episode_index": np.arange(num_episodes, dtype=np.int64),
        "tasks": [[t] for t in tasks],
        "length": (ends - starts).astype(np.int64),
        "data/chunk_index": (file_of // CHUNKS_SIZE).astype(np.int64),
        "data/file_index": (file_of % CHUNKS_SIZE).astype(np.int64),
        "dataset_from_index": starts.astype(np.int64),
        "dataset_to_index": ends.astype(np.int64),
    }
    for key in video_keys:
        columns[f"videos/{key}/chunk_index"] = columns["data/chunk_index"]
        columns[f"videos/{key}/file_index"] = columns["data/file_index"]
        columns[f"videos/{key}/from_timestamp"] = in_file / fps
        columns[f"videos/{key}/to_timestamp"] = (in_file + ends - starts) / fps
    columns["meta/episodes/chunk_index"] = np.zeros(num_episodes, dtype=np.int64)
    columns["meta/episodes/file_index"] = np.zeros(num_episodes, dtype=np.int64)
    for key, st in stats_of.items():
        per_episode = [
            lerobot_stats(combine_stats(st, [e]), int(ends[e] - starts[e]), key in video_keys)
            for e in range(num_episodes)
        ]
        for name in ("min", "max", "mean", "std", "count"):
            columns[f"stats/{key}/{name}"] = [s[name] for s in per_episode]
    path = out / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({k: v if isinstance(v, list) else pa.array(v) for k, v in columns.items()}), path)


def _info_features(
    features: dict[str, Any], video_keys: list[str], fps: int, encoding: VideoEncoding
) -> dict[str, Any]:
    """`info.json`'s features: videos (H, W, C), vectors (d,), scalars (1,), then LeRobot's bookkeeping."""
    out: dict[str, Any] = {}
    for key, ft in features.items():
        shape = list(ft["shape"])
        if key in video_keys:
            channels, height, width = shape
            out[key] = {
                "dtype": "video",
                "shape": [height, width, channels],
                "names": ["height", "width", "channels"],
                "info": {
                    "video.height": height,
                    "video.width": width,
                    "video.codec": "av1",
                    "video.pix_fmt": encoding.pix_fmt,
                    "video.fps": fps,
                    "video.channels": channels,
                    "video.g": encoding.g,
                    "video.crf": encoding.crf,
                    "video.preset": encoding.preset,
                    "has_audio": False,
                    "is_depth_map": False,
                },
            }
        else:
            out[key] = {"dtype": ft["dtype"], "shape": shape or [1], "names": None}
    for key, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        out[key] = {"dtype": dtype, "shape": [1], "names": None}
    return out
