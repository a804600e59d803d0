"""Write an edited LeRobotDataset v3.0: whole episodes of source datasets, renumbered, with their statistics.

`write_dataset(root, selection, dropped)` writes the episodes of `selection` (in its order) at `root`; what it
writes and why is in `lerobot.datasets.edit`'s docstring. `EditWriter` does the work episode by episode, so
memory holds one data file of a source at a time, plus the numeric values where quantiles are recomputed.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot.constants import EPISODE_INDEX, INDEX
from lerobot.datasets.edit_select import REWRITTEN_PREFIXES, TASKS_COLUMN, EditSource
from lerobot.datasets.format import combine_stats, stack_episode_stats, sufficient_stats
from lerobot.datasets.lerobot_export import CHUNKS_SIZE, DATA_FILES_SIZE_IN_MB, lerobot_stats, tasks_table
from lerobot.datasets.lerobot_format import (
    DATA_PATH,
    EPISODES_DIR,
    EPISODES_PATH,
    INFO_PATH,
    NUMERIC_DTYPES,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    EpisodeRef,
    column_to_numpy,
    iter_episode_tables,
)
from lerobot.datasets.lerobot_import import LEROBOT_TASK_INDEX as TASK_INDEX
from lerobot.errors import DatasetError
from lerobot.runtime.files import write_json

LENGTH = "length"
CAMERA_DTYPES = ("video", "image")
BASE_STATS = ("min", "max", "mean", "std", "count")
QUANTILE = re.compile(r"q(\d+)")  # LeRobot's quantile statistics: q01 is the 0.01 quantile
HF_SCHEMA_METADATA = b"huggingface"  # Hugging Face `datasets`' features, in LeRobot's data parquet schemas

# (dataset, its episodes to keep in this order)
Selection = list[tuple[EditSource, list[int]]]


def write_dataset(root: Path, selection: Selection, dropped: Collection[str]) -> None:
    """One dataset at `root` from the episodes of `selection`, in its order."""
    root.mkdir(exist_ok=True)
    writer = EditWriter(root, [source for source, _ in selection], dropped)
    for source, episodes in selection:
        wanted = set(episodes)
        for ep, table in iter_episode_tables(source.dataset, writer.columns):
            if ep.index in wanted:
                writer.add(source, ep, table)
    writer.finish()


class EditWriter:
    """Writes one LeRobotDataset v3.0 at `root`, episode by episode (`add`), then its metadata (`finish`).

    Args:
        root: the (empty) dataset directory.
        sources: the datasets episodes come from; the first one's `info.json` and data schema are the result's.
        dropped: features left out.
    """

    def __init__(self, root: Path, sources: Sequence[EditSource], dropped: Collection[str]):
        first = sources[0]
        self.root, self.info = root, first.info
        self.features = {k: v for k, v in first.info["features"].items() if k not in set(dropped)}
        self.cameras = [k for k, ft in self.features.items() if ft.get("dtype") in CAMERA_DTYPES]
        self.videos = [k for k in self.cameras if self.features[k]["dtype"] == "video"]
        numeric = [k for k, ft in self.features.items() if ft.get("dtype") in NUMERIC_DTYPES]
        # The data parquet's columns: every feature but the videos.
        self.columns = [k for k, ft in self.features.items() if ft.get("dtype") != "video"]
        self.stat_names = {k: _stat_names(sources, k, k in self.cameras) for k in [*numeric, *self.cameras]}
        generated = {EPISODE_INDEX, TASKS_COLUMN, LENGTH, "dataset_from_index", "dataset_to_index"}
        self.extra_columns = [
            c
            for c in first.episodes
            if c not in generated
            and not c.startswith(REWRITTEN_PREFIXES)
            and all(c in s.episodes for s in sources)
        ]
        self.tasks: dict[str, int] = {}  # task string -> task_index in the result
        self.rows: list[dict[str, Any]] = []  # meta/episodes, one per episode
        self.sums: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in self.stat_names}
        self.quantiles: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in self.stat_names}
        self.values: dict[str, list[np.ndarray]] = {k: [] for k in numeric}  # for exact overall quantiles
        self.video_files: dict[tuple[str, Path], int] = {}  # (key, source mp4) -> file number here
        self.schema: pa.Schema | None = None
        self.data: pq.ParquetWriter | None = None
        self.data_file, self.data_bytes, self.frames = -1, 0, 0

    def add(self, source: EditSource, ep: EpisodeRef, table: pa.Table) -> None:
        """Append episode `ep` of `source`, whose parquet rows are `table` (length rows, frame order)."""
        e, n = len(self.rows), table.num_rows
        table = self._renumber(source, ep, table.select(self.columns), e)
        row: dict[str, Any] = {EPISODE_INDEX: e, TASKS_COLUMN: list(source.episodes[TASKS_COLUMN][ep.index])}
        row[LENGTH] = n
        row.update(self._write_rows(table, ep.data_path))
        row.update(dataset_from_index=self.frames, dataset_to_index=self.frames + n)
        row.update(self._video_columns(source, ep))
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        row.update({c: source.episodes[c][ep.index] for c in self.extra_columns})
        row.update(self._episode_stats(source, ep, table))
        self.rows.append(row)
        self.frames += n

    def _renumber(self, source: EditSource, ep: EpisodeRef, table: pa.Table, e: int) -> pa.Table:
        """`table` with this dataset's `episode_index` (e), global `index` and `task_index` (by task string)."""
        n = table.num_rows
        new = {EPISODE_INDEX: np.full(n, e), INDEX: np.arange(self.frames, self.frames + n)}
        if TASK_INDEX in table.column_names:
            old = column_to_numpy(table, TASK_INDEX, (), ep.data_path).astype(np.int64)
            distinct, first, inverse = np.unique(old, return_index=True, return_inverse=True)
            mapped = {int(t): self._task(source, int(t), ep) for t in distinct[np.argsort(first)]}
            new[TASK_INDEX] = np.array([mapped[int(t)] for t in distinct], dtype=np.int64)[inverse]
        for key, values in new.items():
            if key in table.column_names:
                i = table.schema.get_field_index(key)
                table = table.set_column(
                    i, table.schema.field(i), pa.array(values, table.schema.field(i).type)
                )
        return table

    def _task(self, source: EditSource, old: int, ep: EpisodeRef) -> int:
        """The task_index here of the source's task `old` (a new one for a task string not seen yet)."""
        if not 0 <= old < len(source.tasks):
            raise DatasetError(
                f"{ep.data_path}: episode {ep.index}: task_index {old} is not in {source.root / TASKS_PATH} "
                f"(0..{len(source.tasks) - 1})"
            )
        return self.tasks.setdefault(source.tasks[old], len(self.tasks))

    def _write_rows(self, table: pa.Table, path: Path) -> dict[str, int]:
        """Write one episode's rows as a row group, opening a new data file when the current one is full;
        return the episode's data file columns."""
        if self.schema is None:
            self.schema = _schema_for(table.schema, self.columns)
        elif not table.schema.equals(self.schema, check_metadata=False):
            table = _cast(table, self.schema, path)
        if self.data is None or self.data_bytes >= DATA_FILES_SIZE_IN_MB * 1024**2:
            self._close_data()
            self.data_file += 1
            data_path = self.root / DATA_PATH.format(
                chunk_index=self.data_file // CHUNKS_SIZE, file_index=self.data_file % CHUNKS_SIZE
            )
            data_path.parent.mkdir(parents=True, exist_ok=True)
            self.data, self.data_bytes = pq.ParquetWriter(data_path, self.schema, compression="snappy"), 0
        self.data.write_table(table)
        self.data_bytes += table.nbytes
        return {
            "data/chunk_index": self.data_file // CHUNKS_SIZE,
            "data/file_index": self.data_file % CHUNKS_SIZE,
        }

    def _close_data(self) -> None:
        if self.data is not None:
            self.data.close()
            self.data = None

    def _video_columns(self, source: EditSource, ep: EpisodeRef) -> dict[str, Any]:
        """Where episode `ep`'s frames of each video are here: its source mp4, copied once, and the same
        timestamps into it."""
        columns: dict[str, Any] = {}
        for key in self.videos:
            video = ep.videos[key]
            number = self.video_files.get((key, video.path))
            if number is None:
                if not video.path.is_file():
                    raise DatasetError(f"{video.path}: missing video; the LeRobotDataset is incomplete")
                number = sum(1 for k, _ in self.video_files if k == key)
                dest = self.root / VIDEO_PATH.format(
                    video_key=key, chunk_index=number // CHUNKS_SIZE, file_index=number % CHUNKS_SIZE
                )
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(video.path, dest)
                self.video_files[(key, video.path)] = number
            to_column = source.episodes.get(f"videos/{key}/to_timestamp")
            end = to_column[ep.index] if to_column else video.from_timestamp + ep.length / source.dataset.fps
            columns[f"videos/{key}/chunk_index"] = number // CHUNKS_SIZE
            columns[f"videos/{key}/file_index"] = number % CHUNKS_SIZE
            columns[f"videos/{key}/from_timestamp"] = video.from_timestamp
            columns[f"videos/{key}/to_timestamp"] = end
        return columns

    def _episode_stats(self, source: EditSource, ep: EpisodeRef, table: pa.Table) -> dict[str, Any]:
        """The `stats/<key>/<name>` columns of one episode: numeric columns from `table`, cameras as stored
        in the source; kept for the overall statistics."""
        columns: dict[str, Any] = {}
        for key, names in self.stat_names.items():
            quantiles = [n for n in names if QUANTILE.fullmatch(n)]
            if key in self.cameras:
                stored = {n: _stored_stat(source, key, n, ep.index) for n in names}
                columns.update({f"stats/{key}/{n}": stored[n] for n in names})
                mean, std = (np.asarray(stored[n], np.float64).reshape(-1) for n in ("mean", "std"))
                count = float(np.asarray(stored["count"]).reshape(-1)[0])
                sums = {"count": np.array(count), "sum": mean * count, "sumsq": (std**2 + mean**2) * count}
                sums.update({n: np.asarray(stored[n], np.float64).reshape(-1) for n in ("min", "max")})
                self.quantiles[key].append({n: np.asarray(stored[n], np.float64) * count for n in quantiles})
            else:
                shape = tuple(int(s) for s in self.features[key].get("shape") or [1])
                values = column_to_numpy(table, key, shape, ep.data_path).astype(np.float64)
                sums = sufficient_stats(values)
                if quantiles:
                    self.values[key].append(values)
                stats = lerobot_stats(
                    combine_stats(stack_episode_stats([sums]), [0]), len(values), image=False
                )
                stats.update(_quantile_stats(values, quantiles))
                columns.update({f"stats/{key}/{n}": stats[n] for n in names})
            self.sums[key].append(sums)
        return columns

    def finish(self) -> None:
        """Write `meta/episodes`, `meta/stats.json`, `meta/tasks.parquet` and (last) `meta/info.json`."""
        self._close_data()
        episodes = pa.table({k: [row[k] for row in self.rows] for k in self.rows[0]})
        path = self.root / EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(episodes, path)
        write_json(self.root / STATS_PATH, self._overall_stats(), indent=1, fsync=True)
        pq.write_table(tasks_table(list(self.tasks)), self.root / TASKS_PATH)
        info = {
            **self.info,
            "total_episodes": len(self.rows),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "splits": {"train": f"0:{len(self.rows)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.videos else None,
            "features": self.features,
        }
        write_json(self.root / INFO_PATH, info, indent=4, fsync=True)

    def _overall_stats(self) -> dict[str, dict[str, Any]]:
        """`meta/stats.json`: each feature's statistics over the kept episodes (see the module docstring)."""
        stats = {}
        for key, names in self.stat_names.items():
            stacked = stack_episode_stats(self.sums[key])
            count = int(stacked["count"].sum())
            camera = key in self.cameras
            stats[key] = lerobot_stats(combine_stats(stacked, np.arange(len(self.rows))), count, camera)
            quantiles = [n for n in names if QUANTILE.fullmatch(n)]
            if camera:  # weighted by count: the per-episode ones were multiplied by theirs
                pooled = {n: sum(q[n] for q in self.quantiles[key]) / count for n in quantiles}
                stats[key].update({n: v.reshape(-1, 1, 1).tolist() for n, v in pooled.items()})
            elif quantiles:
                stats[key].update(_quantile_stats(np.concatenate(self.values[key]), quantiles))
        return stats


def _stat_names(sources: Sequence[EditSource], key: str, camera: bool) -> list[str]:
    """min, max, mean, std, count, then the quantiles (`qNN`) that every source's `stats.json` has for `key`
    (for a camera, also as per-episode columns)."""
    common: set[str] | None = None
    for source in sources:
        have = {n for n in source.dataset.stats.get(key, {}) if QUANTILE.fullmatch(n)}
        if camera:
            have = {n for n in have if f"stats/{key}/{n}" in source.episodes}
        common = have if common is None else common & have
    return [*BASE_STATS, *sorted(common or (), key=_quantile_level)]


def _quantile_level(name: str) -> float:
    """`q01` -> 0.01, `q50` -> 0.5, `q999` -> 0.999."""
    digits = QUANTILE.fullmatch(name)[1]
    return int(digits) / 10 ** len(digits)


def _quantile_stats(values: np.ndarray, names: Sequence[str]) -> dict[str, list[float]]:
    """The quantiles `names` of `values` (frames, *shape) over frames, as lists of the feature's size."""
    return {n: np.quantile(values, _quantile_level(n), axis=0).reshape(-1).tolist() for n in names}


def _stored_stat(source: EditSource, key: str, name: str, episode: int) -> Any:
    """A camera's per-episode statistic as `meta/episodes` stores it."""
    column = source.episodes.get(f"stats/{key}/{name}")
    if column is None:
        raise DatasetError(
            f"{source.root / EPISODES_DIR}: no column stats/{key}/{name}; an edit needs the per-episode "
            f"statistics of camera {key!r} to recompute meta/stats.json (it does not decode the frames)"
        )
    return column[episode]


def _schema_for(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    """`schema` (of `columns` only), its Hugging Face features metadata restricted to those columns."""
    metadata = dict(schema.metadata or {})
    if HF_SCHEMA_METADATA in metadata:
        try:
            document = json.loads(metadata[HF_SCHEMA_METADATA])
            features = document["info"]["features"]
            document["info"]["features"] = {k: v for k, v in features.items() if k in columns}
            metadata[HF_SCHEMA_METADATA] = json.dumps(document).encode()
        except (ValueError, KeyError, TypeError):  # not the layout known here: dropped, LeRobot needs none
            del metadata[HF_SCHEMA_METADATA]
    return schema.with_metadata(metadata)


def _cast(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    """`table` (rows of a later source) in the first source's column types, or a `DatasetError` naming the
    column that cannot be."""
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError):
        bad = next((f for f in schema if table.schema.field(f.name).type != f.type), schema.field(0))
        raise DatasetError(
            f"{path}: column {bad.name!r} is {table.schema.field(bad.name).type} there and {bad.type} in the "
            "first dataset, which do not convert; merge datasets of the same features"
        ) from None
