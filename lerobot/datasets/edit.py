"""Edit LeRobotDatasets v3.0: delete episodes, split into train/val, merge, remove features, keep tasks.

    delete_episodes(src, out, episodes="3,7,10-12")          delete_episodes(src, out, where=["success=false"])
    split_dataset(src, out, val_fraction=0.1, seed=0)      -> out/train, out/val
    merge_datasets([a, b], out)                             remove_features(src, out, ["next.reward"])
    keep_tasks(src, out, ["Reach a goal position"])

Every edit writes a new dataset and never changes its sources. It is written into a hidden sibling of `out`
(`lerobot.runtime.files.TemporaryDir`, as the exporter does) and renamed into place when complete, so `out`
never holds half an edit; an `out` that exists is refused. Episodes are kept whole and in order (a merge: the
first dataset's, then the next one's), renumbered from 0, with the rows of each:

- **data** (`data/chunk-000/file-NNN.parquet`): the source rows as stored (images, strings and all), with
  `episode_index`, `index` (the global frame) and `task_index` rewritten, one row group per episode, a new
  file every `DATA_FILES_SIZE_IN_MB`; the columns of removed features are left out.
- **videos**: not re-encoded. Each mp4 a kept episode's frames lie in is copied once (for a merge, every
  source's files, renumbered), and the episode points into the copy with its source `from_timestamp` /
  `to_timestamp`: the frames decode bit for bit as before. Frames of dropped episodes stay in the copied
  files, unreferenced.
- **tasks** (`meta/tasks.parquet`): the task strings of the kept frames, in order of first appearance;
  a merge joins tasks by their text.
- **statistics**, recomputed for the kept episodes: every numeric column (bookkeeping included) per
  episode and overall from its values (quantiles `qNN` exactly, where every source's `stats.json` has them);
  cameras, whose frames are not decoded, from their kept per-episode statistics (counts, means and standard
  deviations pooled exactly; quantiles averaged weighted by count, LeRobot's rule).
- `meta/info.json`: the first source's, with the counts, the split, the path templates and the features
  updated.

Which episodes: `lerobot.datasets.edit_select`; the writing: `lerobot.datasets.edit_write`. Errors a user
can fix are one `ConfigError` / `DatasetError` line (`DatasetExistsError` for an `out` that exists).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from lerobot.datasets.edit_select import (
    EditSource,
    episodes_of_tasks,
    episodes_where,
    open_edit_source,
    parse_episodes,
)
from lerobot.datasets.edit_write import Selection, write_dataset
from lerobot.datasets.factory import split_episodes
from lerobot.datasets.lerobot_format import LEROBOT_BOOKKEEPING
from lerobot.errors import ConfigError, DatasetError, DatasetExistsError
from lerobot.runtime.files import TemporaryDir, remove_stale_temporary_dirs

log = logging.getLogger(__name__)

TRAIN, VAL = "train", "val"  # the two datasets `split_dataset` writes, under `out`


def delete_episodes(
    source_dir: Path | str, out_dir: Path | str, episodes: str | Sequence[int] = (), where: Sequence[str] = ()
) -> Path:
    """Write the dataset at `source_dir` without the episodes `episodes` ("3,7,10-12") nor those every
    condition of `where` holds for (`edit_select.episodes_where`, e.g. "success=false"); return `out_dir`."""
    if not episodes and not where:
        raise ConfigError(
            "delete needs the episodes to delete: --episodes 3,7,10-12 or --where success=false"
        )
    source = open_edit_source(source_dir)
    drop = set(parse_episodes(episodes, source)) if episodes else set()
    drop |= set(episodes_where(source, where)) if where else set()
    kept = [e for e in range(source.num_episodes) if e not in drop]
    if not kept:
        raise ConfigError(
            f"that deletes all {source.num_episodes} episodes of {source.root}: nothing would be left; delete fewer"
        )
    if not drop:
        log.warning("no episode of %s matches: the result is a copy of it", source.root)
    log.info("deleting %d of %d episodes of %s: %s", len(drop), source.num_episodes, source.root, _some(drop))
    return write_edit({"": [(source, kept)]}, out_dir)


def split_dataset(
    source_dir: Path | str,
    out_dir: Path | str,
    val_fraction: float | None = None,
    seed: int = 0,
    val_episodes: str | Sequence[int] | None = None,
) -> dict[str, Path]:
    """Write the dataset at `source_dir` as two datasets, `out_dir/train` and `out_dir/val`; return them.

    The validation episodes are `val_episodes`, or else `round(val_fraction * E)` (at least 1) drawn with
    `seed`: the same episodes that training's `dataset.val_fraction` / `dataset.split_seed` hold out
    (`factory.split_episodes`).
    """
    source = open_edit_source(source_dir)
    n = source.num_episodes
    if val_episodes is not None:
        val = parse_episodes(val_episodes, source)
        train = [e for e in range(n) if e not in set(val)]
        if not train:
            raise ConfigError(
                f"--val-episodes names all {n} episodes of {source.root}: none would be left to train"
            )
    else:
        if val_fraction is None:
            raise ConfigError("split needs the validation episodes: --val-fraction 0.1 or --val-episodes 3,7")
        if not 0.0 < val_fraction < 1.0:
            raise ConfigError(f"--val-fraction {val_fraction}: expected a fraction strictly between 0 and 1")
        if max(1, round(val_fraction * n)) >= n:
            raise ConfigError(
                f"--val-fraction {val_fraction} leaves no training episode of the {n} of {source.root}"
            )
        train, val = split_episodes(n, val_fraction, seed)
    log.info(
        "splitting %s: %d training, %d validation episodes %s", source.root, len(train), len(val), _some(val)
    )
    out = write_edit({TRAIN: [(source, train)], VAL: [(source, val)]}, out_dir)
    return {TRAIN: out / TRAIN, VAL: out / VAL}


def merge_datasets(source_dirs: Sequence[Path | str], out_dir: Path | str) -> Path:
    """Write the datasets at `source_dirs`, of the same features and fps, as one dataset; return `out_dir`."""
    if len(source_dirs) < 2:
        raise ConfigError(f"merge needs two or more datasets, got {len(source_dirs)}")
    sources = [open_edit_source(d) for d in source_dirs]
    check_same_features(sources)
    return write_edit({"": [(s, list(range(s.num_episodes))) for s in sources]}, out_dir)


def remove_features(source_dir: Path | str, out_dir: Path | str, names: Sequence[str]) -> Path:
    """Write the dataset at `source_dir` without the features `names` (columns, videos, statistics)."""
    source = open_edit_source(source_dir)
    features = source.dataset.features
    for name in names:
        if name in LEROBOT_BOOKKEEPING:
            raise ConfigError(
                f"{name!r} is one of LeRobot's bookkeeping columns ({', '.join(LEROBOT_BOOKKEEPING)}), which "
                "every LeRobotDataset has: it cannot be removed"
            )
        if name not in features:
            others = [k for k in features if k not in LEROBOT_BOOKKEEPING]
            raise ConfigError(f"feature {name!r} is not in {source.root}; its features: {', '.join(others)}")
    return write_edit({"": [(source, list(range(source.num_episodes)))]}, out_dir, dropped=names)


def keep_tasks(source_dir: Path | str, out_dir: Path | str, tasks: Sequence[str]) -> Path:
    """Write the episodes of the dataset at `source_dir` whose tasks are all among `tasks`."""
    source = open_edit_source(source_dir)
    kept = episodes_of_tasks(source, tasks)
    if not kept:
        raise ConfigError(f"no episode of {source.root} has only the tasks {list(tasks)}: nothing to write")
    return write_edit({"": [(source, kept)]}, out_dir)


def check_same_features(sources: Sequence[EditSource]) -> None:
    """Raise `DatasetError` naming the first feature (or the fps) in which a source differs from the first:
    present in one only, or of another dtype or shape."""
    first = sources[0]
    for other in sources[1:]:
        if other.dataset.fps != first.dataset.fps:
            raise DatasetError(
                f"{other.root} is recorded at {other.dataset.fps} fps, {first.root} at {first.dataset.fps} fps; "
                "only datasets of one frame rate merge"
            )
        a, b = first.dataset.features, other.dataset.features
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                has, lacks = (first, other) if key in a else (other, first)
                raise DatasetError(
                    f"feature {key!r} is in {has.root} but not in {lacks.root}; merge datasets of the same "
                    f"features (remove-feature {key} from {has.root} first)"
                )
            kinds = [(ft[key].get("dtype"), list(ft[key].get("shape") or [])) for ft in (a, b)]
            if kinds[0] != kinds[1]:
                raise DatasetError(
                    f"feature {key!r} is {kinds[0][0]} {kinds[0][1]} in {first.root} but {kinds[1][0]} "
                    f"{kinds[1][1]} in {other.root}; merge datasets of the same features"
                )


def write_edit(parts: Mapping[str, Selection], out_dir: Path | str, dropped: Collection[str] = ()) -> Path:
    """Write each part (name -> the episodes to keep) as a dataset at `out_dir / name` (`""`: `out_dir`
    itself), without the features `dropped`, atomically: all parts appear at once or nothing does.

    Raises:
        DatasetExistsError: `out_dir` exists (before, or made by another writer meanwhile).
        ConfigError: `out_dir` lies inside a source dataset.
    """
    out = check_new_out(out_dir)
    for source, _ in (pair for selection in parts.values() for pair in selection):
        root = source.root.resolve()
        if out.resolve() == root or root in out.resolve().parents:
            raise ConfigError(
                f"--out {out} lies inside the source dataset {source.root}; write the edit elsewhere"
            )
    removed, freed = remove_stale_temporary_dirs(out)
    if removed:
        log.info(
            "removed %d unfinished edit(s) of %s left by killed runs (%.1f MB)", removed, out, freed / 1e6
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with TemporaryDir(out) as writing:
        for name, selection in parts.items():
            write_dataset(writing.path / name, selection, dropped)
        try:
            writing.install(replace=False)
        except FileExistsError:  # another writer made `out` meanwhile
            raise DatasetExistsError(_exists(out)) from None
    return out


def check_new_out(out_dir: Path | str) -> Path:
    """`out_dir` as a Path; `DatasetExistsError` when it exists already (an edit never replaces a directory)."""
    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        raise DatasetExistsError(_exists(out))
    return out


def _some(episodes: Collection[int], shown: int = 20) -> str:
    """Up to `shown` of `episodes`, sorted, for a log line: `[1, 4, 9, ... (53 in all)]`."""
    items = sorted(episodes)
    more = f", ... ({len(items)} in all)" if len(items) > shown else ""
    return "[" + ", ".join(map(str, items[:shown])) + more + "]"


def _exists(out: Path) -> str:
    return f"--out {out}: already exists; choose another directory (an edit never replaces one)"
