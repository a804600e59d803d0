"""Which episodes an edit keeps: the source datasets of an edit, episode lists, `--where` conditions, tasks.

`open_edit_source` reads a LeRobotDataset v3.0 (`lerobot.datasets.lerobot_format`) with what an edit needs
besides its checked metadata: `info.json` as written, the task table and every column of `meta/episodes`.
The rest picks episodes:

- `parse_episodes("3,7,10-12", source)`: indices and inclusive ranges;
- `episodes_where(source, ["success=false", "length<20"])`: the episodes every condition holds for. A field
  is a scalar column of `meta/episodes` (`length`, or one a tool added), `task` (true when any of the
  episode's tasks is the value) or `success`: whether the episode succeeded, that is whether any of its
  frames has `next.success` set, as this project's evaluation counts an episode's success and records it
  (`eval.record_dataset`: `next.success` per step);
- `episodes_of_tasks(source, tasks)`: the episodes all of whose tasks are among `tasks`.

A request the dataset cannot answer (an index it lacks, a field it lacks, a task it lacks) is one
`ConfigError` line naming the dataset, the problem and what it has.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lerobot.constants import NEXT_SUCCESS
from lerobot.datasets.lerobot_format import (
    EPISODES_DIR,
    INFO_PATH,
    V30,
    LeRobotSource,
    column_to_numpy,
    iter_episode_tables,
    open_lerobot_dataset,
    read_parquet,
    read_task_table,
)
from lerobot.errors import ConfigError, DatasetError

# Episode fields of `--where` besides the scalar columns of meta/episodes.
SUCCESS_FIELD = "success"
TASK_FIELD = "task"
TASKS_COLUMN = "tasks"  # meta/episodes: the task strings of each episode
# `--where FIELD OP VALUE`; two-character operators first so that `<=` is not read as `<`.
OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "!=": operator.ne,
    "==": operator.eq,
    "=": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
}
_CONDITION = re.compile(r"\s*([^<>=!\s]+)\s*(" + "|".join(map(re.escape, OPERATORS)) + r")\s*(.*?)\s*")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
# Column families of meta/episodes that an edit rewrites rather than filters on, and other columns no
# condition is about (`task` reads `tasks`).
REWRITTEN_PREFIXES = ("stats/", "videos/", "data/", "meta/")
_NOT_FIELDS = (TASKS_COLUMN, "dataset_from_index", "dataset_to_index")


@dataclass
class EditSource:
    """A LeRobotDataset v3.0 to edit.

    Attributes:
        dataset: the checked metadata (`open_lerobot_dataset`): fps, features, episodes and their files.
        info: `meta/info.json` as written (copied into the result, with its counts and features updated).
        tasks: the task table, the string of each `task_index` 0..T-1.
        episodes: every column of `meta/episodes`, one value per episode, in episode order (E values each).
    """

    dataset: LeRobotSource
    info: dict[str, Any]
    tasks: list[str]
    episodes: dict[str, list[Any]]

    @property
    def root(self) -> Path:
        """The dataset directory."""
        return self.dataset.root

    @property
    def num_episodes(self) -> int:
        """E, the number of episodes."""
        return len(self.dataset.episodes)


def open_edit_source(root: Path | str) -> EditSource:
    """Read the LeRobotDataset v3.0 at `root` for an edit (see the module docstring).

    Raises:
        DatasetNotFoundError: `root` holds no `meta/info.json`.
        DatasetError: another layout than v3.0, or malformed metadata (one line naming the file).
    """
    dataset = open_lerobot_dataset(root)
    if dataset.version != V30:
        raise DatasetError(
            f"{dataset.root}: a LeRobotDataset {dataset.version}; edits read v3.0 only: convert it first with "
            "LeRobot's convert_dataset_v21_to_v30"
        )
    info = json.loads((dataset.root / INFO_PATH).read_text())
    tasks = read_task_table(dataset) or []
    tables = [
        read_parquet(path).to_pydict() for path in sorted((dataset.root / EPISODES_DIR).glob("*/*.parquet"))
    ]
    names = [name for name in tables[0] if all(name in t for t in tables)]
    episodes = {name: [v for t in tables for v in t[name]] for name in names}
    if TASKS_COLUMN not in episodes:
        raise DatasetError(
            f"{dataset.root / EPISODES_DIR}: no column {TASKS_COLUMN!r} (each episode's task strings)"
        )
    order = np.argsort(episodes["episode_index"], kind="stable")
    return EditSource(dataset, info, tasks, {k: [v[i] for i in order] for k, v in episodes.items()})


def parse_episodes(text: str | Sequence[int], source: EditSource) -> list[int]:
    """Episode indices from `"3,7,10-12"` (or a list of ints), sorted and distinct, each checked against
    `source`.

    Raises:
        ConfigError: a part is no index or `a-b` range, or names an episode the dataset lacks.
    """
    indices: list[int] = []
    parts = text.split(",") if isinstance(text, str) else [str(i) for i in text]
    for part in (p.strip() for p in parts):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ConfigError(
                f"--episodes {text}: {part!r} is not an episode index or a range a-b (e.g. --episodes 3,7,10-12)"
            )
        indices += range(int(match[1]), int(match[2] or match[1]) + 1)
    absent = sorted({i for i in indices if i >= source.num_episodes})
    if absent:
        raise ConfigError(
            f"--episodes {text}: episode {absent[0]} is not in {source.root}, which has episodes "
            f"0..{source.num_episodes - 1}; name existing episodes"
        )
    return sorted(set(indices))


def episodes_where(source: EditSource, conditions: Sequence[str]) -> list[int]:
    """The episodes of `source` that every condition (`FIELD OP VALUE`, e.g. `success=false`) holds for.

    Raises:
        ConfigError: a malformed condition, a field the dataset lacks or a value of the wrong kind.
    """
    kept = np.ones(source.num_episodes, dtype=bool)
    for condition in conditions:
        match = _CONDITION.fullmatch(condition)
        if match is None or not match[3]:
            raise ConfigError(
                f"--where {condition}: expected FIELD OP VALUE with OP one of {' '.join(OPERATORS)} "
                "(e.g. --where success=false, --where length<20)"
            )
        field, op, text = match.groups()
        values = episode_field(source, field, condition)
        kept &= [_holds(value, op, text, condition) for value in values]
    return np.flatnonzero(kept).tolist()


def episode_field(source: EditSource, field: str, condition: str = "") -> list[Any]:
    """The value of `field` for each episode of `source` (E values; see the module docstring).

    Raises:
        ConfigError: the dataset has no such field.
    """
    columns = [k for k in source.episodes if not k.startswith(REWRITTEN_PREFIXES) and k not in _NOT_FIELDS]
    if field in columns:
        return source.episodes[field]
    if field == TASK_FIELD:
        return source.episodes[TASKS_COLUMN]
    if field == SUCCESS_FIELD and NEXT_SUCCESS in source.dataset.features:
        return [
            bool(column_to_numpy(table, NEXT_SUCCESS, (1,), ep.data_path).any())
            for ep, table in iter_episode_tables(source.dataset, [NEXT_SUCCESS])
        ]
    fields = sorted(
        {*columns, TASK_FIELD} | ({SUCCESS_FIELD} if NEXT_SUCCESS in source.dataset.features else set())
    )
    lacks = f" (it has no {NEXT_SUCCESS} feature)" if field == SUCCESS_FIELD else ""
    raise ConfigError(
        f"--where {condition}: the dataset at {source.root} has no episode field {field!r}{lacks}; "
        f"its fields: {', '.join(fields)}"
    )


def _holds(value: Any, op: str, text: str, condition: str) -> bool:
    """Whether `value OP text` holds, `text` read as the kind of `value` (a list: one of its items equals)."""
    if isinstance(value, list):
        if op not in ("=", "==", "!="):
            raise ConfigError(f"--where {condition}: a task compares with = or != only")
        return (text in value) == (op != "!=")
    if isinstance(value, (bool, np.bool_)):
        if text.lower() not in _BOOLEANS or op not in ("=", "==", "!="):
            raise ConfigError(f"--where {condition}: a yes/no field compares with = or != to true or false")
        return OPERATORS[op](bool(value), _BOOLEANS[text.lower()])
    if isinstance(value, (int, float, np.number)):
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"--where {condition}: {text!r} is not a number") from None
        return OPERATORS[op](float(value), number)
    return OPERATORS[op](str(value), text)


def episodes_of_tasks(source: EditSource, tasks: Sequence[str]) -> list[int]:
    """The episodes of `source` whose every task (`meta/episodes` `tasks`) is one of `tasks`.

    Raises:
        ConfigError: a task is not in the dataset's task table (the message lists some it has).
    """
    for task in tasks:
        if task not in source.tasks:
            shown = ", ".join(repr(t) for t in source.tasks[:5]) + (", ..." if len(source.tasks) > 5 else "")
            raise ConfigError(
                f"task {task!r} is not a task of {source.root} ({len(source.tasks)} tasks: {shown}); give the "
                "task string exactly as meta/tasks.parquet holds it"
            )
    wanted = set(tasks)
    return [e for e, have in enumerate(source.episodes[TASKS_COLUMN]) if set(have) <= wanted]
