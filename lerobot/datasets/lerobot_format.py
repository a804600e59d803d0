"""Read a LeRobotDataset directory: LeRobot's v3.0 layout (what LeRobot 0.4-0.6 writes) and the older v2.1.

v3.0 (many episodes per file; an episode's rows and video frames are located through `meta/episodes`):

    meta/info.json                                codebase_version, fps, features, path templates
    meta/stats.json                               statistics over all frames
    meta/tasks.parquet                            task strings -> task_index
    meta/episodes/chunk-XXX/file-YYY.parquet      per episode: length, data/{chunk,file}_index,
                                                  dataset_{from,to}_index, videos/<key>/{chunk_index,
                                                  file_index, from_timestamp, to_timestamp}, stats/...
    data/chunk-XXX/file-YYY.parquet               one row per frame
    videos/<key>/chunk-XXX/file-YYY.mp4           frame of row r at `from_timestamp + timestamp[r]`

v2.1 (one parquet file and one mp4 per episode; frame of row r at `timestamp[r]` in the episode's video):

    meta/info.json, meta/episodes.jsonl, meta/episodes_stats.jsonl, meta/tasks.jsonl
    data/chunk-XXX/episode_NNNNNN.parquet, videos/chunk-XXX/<key>/episode_NNNNNN.mp4

Camera features are stored either as videos (`dtype: video`) or, as LeRobot records them with
`use_videos=False`, as images in the parquet rows (`dtype: image`: a `{bytes, path}` struct per row holding
a PNG, what Hugging Face `datasets` writes for its `Image` feature). Both decode to the same (3, H, W) uint8
frames (`lerobot.datasets.lerobot_frames` decodes them).

Everything malformed is a `DatasetError` (or `DatasetNotFoundError`) of one line naming the file and the
problem. Video frames are matched to the timestamps rows ask for within `TOLERANCE_S`, as LeRobot's
loader does (`tolerance_s=1e-4`).

A dataset may come from anyone: the paths that `info.json`'s `data_path` and `video_path` templates give must
lie inside the dataset directory (no absolute path, no `..` out of it: `template_path`), and a feature name,
which names a file of the conversion, holds no `/`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot.errors import DatasetError, DatasetNotFoundError
from lerobot.runtime.files import path_within

V30, V21 = "v3.0", "v2.1"
SUPPORTED_VERSIONS = (V30, V21)
# A row's timestamp and the video frame shown for it may differ by this much (LeRobot's default tolerance_s).
TOLERANCE_S = 1e-4

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
LEGACY_EPISODES_PATH = "meta/episodes.jsonl"
LEGACY_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"
LEGACY_TASKS_PATH = "meta/tasks.jsonl"

# Per-frame columns every LeRobotDataset has; they are bookkeeping, not features to learn from.
LEROBOT_BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
NUMERIC_DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclass(frozen=True)
class VideoRef:
    """Where one episode's frames of one camera are: the mp4 and the time of the episode's first frame."""

    path: Path
    from_timestamp: float


@dataclass(frozen=True)
class EpisodeRef:
    """One episode of a LeRobotDataset: its index, number of frames, parquet file and videos per key."""

    index: int
    length: int
    data_path: Path
    videos: dict[str, VideoRef]


@dataclass
class LeRobotSource:
    """A checked LeRobotDataset directory (see the module docstring for both layouts).

    Attributes:
        root: the dataset directory (holds `meta/info.json`).
        version: `codebase_version` from `info.json` ("v3.0" or "v2.1").
        fps: frames per second.
        features: `info.json`'s features (dtype, shape, names, info per key).
        episodes: every episode, sorted by index (0..E-1).
        stats: feature -> {"min", "max", ...} as stored (v3.0: `stats.json`; v2.1: per episode, combined
            here with min/max only, which is all the cross-check needs).
    """

    root: Path
    version: str
    fps: int
    features: dict[str, dict[str, Any]]
    episodes: list[EpisodeRef]
    stats: dict[str, dict[str, np.ndarray]]

    @property
    def video_keys(self) -> list[str]:
        """Features stored as mp4 videos."""
        return [k for k, ft in self.features.items() if ft.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        """Camera features stored as images in the parquet rows."""
        return [k for k, ft in self.features.items() if ft.get("dtype") == "image"]

    @property
    def numeric_keys(self) -> list[str]:
        """Per-frame numeric features stored in the parquet files, bookkeeping columns excluded."""
        return [
            k
            for k, ft in self.features.items()
            if ft.get("dtype") in NUMERIC_DTYPES and k not in LEROBOT_BOOKKEEPING
        ]

    @property
    def num_frames(self) -> int:
        """Total number of frames over all episodes."""
        return sum(ep.length for ep in self.episodes)

    def frame_shape(self, key: str) -> tuple[int, int]:
        """(height, width) of camera feature `key` (video or image), from its `names` (height/width/channels)
        and `shape`."""
        return self._frame_dims(key)[:2]

    def frame_channels(self, key: str) -> int:
        """The number of channels of camera feature `key`, from its `names` and `shape`."""
        return self._frame_dims(key)[2]

    def _frame_dims(self, key: str) -> tuple[int, int, int]:
        ft = self.features[key]
        shape = [int(s) for s in ft["shape"]]
        names = [str(n).lower() for n in (ft.get("names") or [])]
        if len(shape) != 3:
            raise DatasetError(
                f"{self.root / INFO_PATH}: {ft.get('dtype')} feature {key!r} has shape {shape}, expected 3 dims"
            )
        if len(names) == 3 and "height" in names and "width" in names:
            height, width = names.index("height"), names.index("width")
            return shape[height], shape[width], shape[3 - height - width]
        # LeRobot writes (height, width, channels) unless the names say otherwise.
        return shape[0], shape[1], shape[2]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: missing; the LeRobotDataset is incomplete (copy or download it again)"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable JSON ({e})") from None


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: missing; the LeRobotDataset is incomplete (copy or download it again)"
        ) from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{i + 1}: unreadable JSON line ({e})") from None
    return rows


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read `columns` of a parquet file; a missing, corrupt or column-less file is one `DatasetError` line."""
    if not path.is_file():
        raise DatasetError(f"{path}: missing; the LeRobotDataset is incomplete (copy or download it again)")
    try:
        schema = pq.read_schema(path)
        if columns is not None:
            absent = [c for c in columns if c not in schema.names]
            if absent:
                raise DatasetError(f"{path}: no column {absent} (it has {schema.names})")
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: unreadable parquet file ({type(e).__name__}: {e})") from None


def column_to_numpy(table: pa.Table, key: str, shape: tuple[int, ...], path: Path) -> np.ndarray:
    """A numeric column (scalars, or lists / fixed-size lists of `shape[0]` values) -> (rows, *shape) array."""
    column = table.column(key).combine_chunks()
    if column.null_count:
        raise DatasetError(f"{path}: column {key!r} holds {column.null_count} missing values")
    rows = len(column)
    values = column
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False)
    if flat.size != rows * int(np.prod(shape, dtype=np.int64)):
        raise DatasetError(
            f"{path}: column {key!r} holds {flat.size} values for {rows} rows, info.json says shape {list(shape)}"
        )
    return flat.reshape(rows, *shape)


def open_lerobot_dataset(root: Path | str) -> LeRobotSource:
    """Read and check the metadata of the LeRobotDataset at `root` (v3.0 or v2.1); data is read later.

    Raises:
        DatasetNotFoundError: `root` holds no `meta/info.json`.
        DatasetError: unsupported `codebase_version`, missing metadata or statistics, inconsistent episodes.
    """
    root = Path(root)
    info_path = root / INFO_PATH
    if not info_path.is_file():
        raise DatasetNotFoundError(
            f"{root}: no {INFO_PATH}; not a LeRobotDataset directory (expected meta/, data/, videos/ in it)"
        )
    info = _load_json(info_path)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version not in SUPPORTED_VERSIONS:
        raise DatasetError(
            f"{info_path}: codebase_version {version!r} is not supported (this reader reads {' and '.join(SUPPORTED_VERSIONS)}); "
            "convert the dataset with LeRobot's convert_dataset_v21_to_v30 or download its v3.0 revision"
        )
    missing = [k for k in ("fps", "features", "total_episodes") if k not in info]
    if missing:
        raise DatasetError(f"{info_path}: lacks {missing}")
    fps = info["fps"]
    if not isinstance(fps, int) or fps <= 0:
        raise DatasetError(f"{info_path}: fps={fps!r}, expected a positive integer")
    features = info["features"]
    if not isinstance(features, dict):
        raise DatasetError(f"{info_path}: features is a {type(features).__name__}, expected name -> feature")
    for key in features:
        if "/" in key or "\0" in key:  # the conversion writes feature `key` to `<key>.npy`
            raise DatasetError(
                f"{info_path}: feature name {key!r} holds a '/' (or NUL); a feature name is a file name of "
                "the conversion: rename the feature"
            )
    if version == V30:
        episodes, stats = _v30_episodes(root, info), _v30_stats(root)
    else:
        episodes, stats = _v21_episodes(root, info), _v21_stats(root, info)
    if len(episodes) != info["total_episodes"]:
        raise DatasetError(
            f"{info_path}: total_episodes={info['total_episodes']} but {len(episodes)} episodes are listed"
        )
    if [ep.index for ep in episodes] != list(range(len(episodes))):
        raise DatasetError(f"{root / 'meta'}: episode indices must run 0..{len(episodes) - 1} without gaps")
    source = LeRobotSource(root, version, fps, features, episodes, stats)
    for key in source.video_keys:
        source.frame_shape(key)
    for key in source.image_keys:
        if source.frame_channels(key) != 3:  # videos decode to RGB whatever they hold; images do not
            raise DatasetError(
                f"{info_path}: image feature {key!r} has {source.frame_channels(key)} channels (shape "
                f"{features[key]['shape']}); only RGB images (3 channels) are read"
            )
    return source


def template_path(
    root: Path, info: dict[str, Any], key: str, default: str | None = None, **fields: Any
) -> Path:
    """The file that `info.json`'s path template `key` (`data_path`, `video_path`) names for `fields`.

    The template may use only the names in `fields` (no attribute or index lookups), and the path it gives
    must lie inside `root`: a dataset from elsewhere cannot make the import read (or name) files outside it.
    `default`: the template when `info.json` has none (null or absent).

    Raises:
        DatasetError: the template is no string, uses other fields or a bad format, or leads out of `root`.
    """
    template = info.get(key) or default
    where = f"{root / INFO_PATH}: {key}={template!r}"
    if not isinstance(template, str):
        raise DatasetError(f"{where} is not a path template (a string such as {default or DATA_PATH!r})")
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:  # an unbalanced brace
        raise DatasetError(f"{where} is not a valid path template ({e})") from None
    if not names <= fields.keys():  # `{0}`, `{chunk_index.__class__}`: a lookup, not a field
        raise DatasetError(
            f"{where} uses {sorted(names - fields.keys())}; a {key} template may use only {sorted(fields)}"
        )
    try:
        relative = template.format(**fields)
    except (ValueError, TypeError, LookupError, AttributeError) as e:  # a bad format spec: `{chunk_index:s}`
        raise DatasetError(f"{where} is not a valid path template ({type(e).__name__}: {e})") from None
    path = path_within(root, relative)
    if path is None:
        raise DatasetError(
            f"{where} names {relative!r}, outside the dataset directory {root}; a {key} template is a "
            "relative path inside the dataset (LeRobot writes such): fix info.json or get the dataset again"
        )
    return path


def _v30_episodes(root: Path, info: dict[str, Any]) -> list[EpisodeRef]:
    files = sorted((root / EPISODES_DIR).glob("*/*.parquet"))
    if not files:
        raise DatasetError(f"{root / EPISODES_DIR}: no episode metadata (chunk-*/file-*.parquet)")
    video_keys = [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]
    columns = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    for key in video_keys:
        columns += [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
    episodes = []
    for path in files:
        table = read_parquet(path, columns).to_pydict()
        for row in range(len(table["episode_index"])):
            data_path = template_path(
                root,
                info,
                "data_path",
                DATA_PATH,
                chunk_index=table["data/chunk_index"][row],
                file_index=table["data/file_index"][row],
            )
            videos = {
                key: VideoRef(
                    template_path(
                        root,
                        info,
                        "video_path",
                        VIDEO_PATH,
                        video_key=key,
                        chunk_index=table[f"videos/{key}/chunk_index"][row],
                        file_index=table[f"videos/{key}/file_index"][row],
                    ),
                    float(table[f"videos/{key}/from_timestamp"][row]),
                )
                for key in video_keys
            }
            episodes.append(
                EpisodeRef(int(table["episode_index"][row]), int(table["length"][row]), data_path, videos)
            )
    return sorted(episodes, key=lambda ep: ep.index)


def _v21_episodes(root: Path, info: dict[str, Any]) -> list[EpisodeRef]:
    rows = _load_jsonl(root / LEGACY_EPISODES_PATH)
    video_keys = [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]
    chunks_size = int(info.get("chunks_size", 1000))
    for key in ("data_path",) + (("video_path",) if video_keys else ()):
        if not info.get(key):
            raise DatasetError(f"{root / INFO_PATH}: lacks {key!r}")
    episodes = []
    for row in rows:
        if "episode_index" not in row or "length" not in row:
            raise DatasetError(f"{root / LEGACY_EPISODES_PATH}: a line lacks episode_index or length: {row}")
        index = int(row["episode_index"])
        chunk = index // chunks_size
        data_path = template_path(root, info, "data_path", episode_chunk=chunk, episode_index=index)
        videos = {
            key: VideoRef(
                template_path(
                    root, info, "video_path", episode_chunk=chunk, video_key=key, episode_index=index
                ),
                0.0,
            )
            for key in video_keys
        }
        episodes.append(EpisodeRef(index, int(row["length"]), data_path, videos))
    return sorted(episodes, key=lambda ep: ep.index)


def _v30_stats(root: Path) -> dict[str, dict[str, np.ndarray]]:
    path = root / STATS_PATH
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing; a v3.0 LeRobotDataset keeps its statistics there (copy or download the dataset again)"
        )
    stats = _load_json(path)
    if not isinstance(stats, dict):
        raise DatasetError(f"{path}: expected feature -> statistics, got {type(stats).__name__}")
    return {
        k: {n: np.asarray(v, dtype=np.float64) for n, v in s.items()}
        for k, s in stats.items()
        if isinstance(s, dict)
    }


def _v21_stats(root: Path, info: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    path = root / LEGACY_EPISODES_STATS_PATH
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing; a v2.1 LeRobotDataset keeps its per-episode statistics there (copy or download it again)"
        )
    combined: dict[str, dict[str, np.ndarray]] = {}
    for row in _load_jsonl(path):
        for key, st in (row.get("stats") or {}).items():
            if not isinstance(st, dict) or "min" not in st or "max" not in st:
                continue
            lo, hi = np.asarray(st["min"], dtype=np.float64), np.asarray(st["max"], dtype=np.float64)
            if key in combined:
                lo, hi = np.minimum(lo, combined[key]["min"]), np.maximum(hi, combined[key]["max"])
            combined[key] = {"min": lo, "max": hi}
    return combined


def read_task_table(source: LeRobotSource) -> list[str] | None:
    """LeRobot's task table: the task string of each `task_index` 0..T-1 (v3.0 `meta/tasks.parquet`, v2.1
    `meta/tasks.jsonl`), or None for a dataset without one.

    Raises:
        DatasetError: the table does not number its tasks 0..T-1 once each.
    """
    if source.version == V30:
        path = source.root / TASKS_PATH
        if not path.is_file():
            return None
        table = read_parquet(path, ["task_index", "task"]).to_pydict()
        rows = list(zip(table["task_index"], table["task"]))
    else:
        path = source.root / LEGACY_TASKS_PATH
        if not path.is_file():
            return None
        rows = [(row.get("task_index"), row.get("task")) for row in _load_jsonl(path)]
    if sorted(index for index, _ in rows if isinstance(index, int)) != list(range(len(rows))) or not all(
        isinstance(task, str) for _, task in rows
    ):
        raise DatasetError(
            f"{path}: expected task_index 0..{len(rows) - 1} once each, each with a task string"
        )
    return [task for _, task in sorted(rows)]


def iter_episode_tables(source: LeRobotSource, columns: list[str]) -> Iterator[tuple[EpisodeRef, pa.Table]]:
    """Yield (episode, its rows with `columns`) in episode order, reading each parquet file once.

    Checks that an episode's rows are contiguous in its file and that there are `length` of them.
    """
    by_file: dict[Path, list[EpisodeRef]] = {}
    for ep in source.episodes:
        by_file.setdefault(ep.data_path, []).append(ep)
    wanted = list(dict.fromkeys(["episode_index", *columns]))
    pending: dict[int, tuple[EpisodeRef, pa.Table]] = {}
    next_index = 0
    for path, eps in by_file.items():
        table = read_parquet(path, wanted)
        ep_col = table.column("episode_index").to_numpy()
        for ep in eps:
            rows = np.flatnonzero(ep_col == ep.index)
            if len(rows) != ep.length or (len(rows) and rows[-1] - rows[0] + 1 != len(rows)):
                raise DatasetError(
                    f"{path}: episode {ep.index} has {len(rows)} rows (contiguous: "
                    f"{bool(len(rows)) and rows[-1] - rows[0] + 1 == len(rows)}), the episode metadata says {ep.length}"
                )
            pending[ep.index] = (ep, table.slice(int(rows[0]) if len(rows) else 0, len(rows)))
        while next_index in pending:
            yield pending.pop(next_index)
            next_index += 1
    while next_index in pending:
        yield pending.pop(next_index)
        next_index += 1
