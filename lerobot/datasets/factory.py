"""Build the dataset for a config (episode split, feature selection) and a resumable, seeded DataLoader.

Data order: batch `s` (the global training step) is fixed by `(seed, s)` alone. Epoch `e = s // steps_per_epoch`
shuffles all items with a numpy generator seeded by `(seed, e)`, and step `s` takes slice
`s % steps_per_epoch` of that permutation. A run resumed at step `k` calls
`cycle_batches(dataset, batch_size, seed, start_step=k)` (an endless iterator) or
`make_dataloader(..., seed=seed, start_step=k, num_steps=total_steps - k)` and receives exactly the batches an
uninterrupted run would have seen from step `k` on, whatever `num_workers` is; nothing from the old
DataLoader (generator state, iterator position) needs to be saved: the checkpoint's step is enough.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lerobot.config import DatasetConfig, EnvConfig, FeatureConfig
from lerobot.constants import ACTION, TASK, VISUAL
from lerobot.datasets.episode_dataset import EpisodeDataset, collate_batch
from lerobot.datasets.format import META_FILE, feature_file, read_meta
from lerobot.datasets.lerobot_import import LEROBOT_FORMAT, prepare_lerobot
from lerobot.datasets.pusht_import import prepare_pusht
from lerobot.errors import ConfigError
from lerobot.runtime.signals import ignore_stop_signals

log = logging.getLogger(__name__)

SPLITS = ("train", "val")

# `dataset.format` -> importer: finds (or downloads) the source data and converts it once into the
# project's format (`lerobot.datasets.format`); returns the converted directory.
IMPORTERS: dict[str, Callable[[DatasetConfig], Path]] = {
    "pusht_zarr": prepare_pusht,
    LEROBOT_FORMAT: prepare_lerobot,
}


def dataset_format(dataset_cfg: DatasetConfig) -> str:
    """`dataset.format`, or when unset `lerobot` if `dataset.repo_id` is set, else `pusht_zarr`."""
    if dataset_cfg.format:
        return dataset_cfg.format
    return LEROBOT_FORMAT if dataset_cfg.repo_id else "pusht_zarr"


def import_dataset(dataset_cfg: DatasetConfig) -> Path:
    """Run the importer `dataset_cfg.format` names; return the directory of the converted dataset."""
    name = dataset_format(dataset_cfg)
    importer = IMPORTERS.get(name)
    if importer is None:
        raise ConfigError(
            f"dataset.format={name!r} is unknown; expected one of {', '.join(sorted(IMPORTERS))}"
        )
    if dataset_cfg.image_size is not None and name != LEROBOT_FORMAT:
        raise ConfigError(
            f"dataset.image_size resizes the camera frames of a LeRobotDataset at import; dataset.format={name} "
            "keeps its frames as recorded: unset dataset.image_size"
        )
    return importer(dataset_cfg)


def dataset_fingerprint(dataset_cfg: DatasetConfig, root: Path | None = None) -> dict[str, Any]:
    """What a run trains on, as recorded with each of its checkpoints and compared when it resumes.

    `{"format", "episodes", "frames", "sha256", "source"}`: the importer (`dataset_format`), the episode and
    frame counts of the whole converted dataset, the content hash its importer recorded at conversion
    (`meta.json`'s `source.fingerprint`: PushT's episode boundaries, states and actions, a LeRobotDataset's
    metadata and parquet files; never the path, so moved data keeps its fingerprint; a conversion without
    one is hashed by its `meta.json`) and, for messages only, where the data came from.

    Args:
        dataset_cfg: the run's `dataset` section.
        root: the converted dataset, when already imported (else `import_dataset` finds it).
    """
    root = import_dataset(dataset_cfg) if root is None else Path(root)
    meta = read_meta(root)
    source = meta.get("source", {})
    sha256 = source.get("fingerprint") or hashlib.sha256((root / META_FILE).read_bytes()).hexdigest()
    return {
        "format": dataset_format(dataset_cfg),
        "episodes": len(meta["episode_ends"]),
        "frames": int(meta["num_frames"]),
        "sha256": sha256,
        "source": str(source.get("path", root)),
    }


def split_episodes(num_episodes: int, val_fraction: float, split_seed: int) -> tuple[list[int], list[int]]:
    """Split episode indices into sorted (train, val) lists, seeded; whole episodes go to one side.

    `round(val_fraction * num_episodes)` episodes (at least 1 when `val_fraction > 0`) go to validation.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"dataset.val_fraction={val_fraction} must lie in [0, 1)")
    n_val = round(val_fraction * num_episodes)
    if val_fraction > 0:
        n_val = max(1, n_val)
    if n_val >= num_episodes:
        raise ConfigError(
            f"dataset.val_fraction={val_fraction} leaves no training episode out of {num_episodes}"
        )
    order = np.random.default_rng(split_seed).permutation(num_episodes)
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def make_dataset(
    dataset_cfg: DatasetConfig,
    env_cfg: EnvConfig,
    delta_timestamps: Mapping[str, Sequence[float]] | None = None,
    split: str = "train",
    keys: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
) -> EpisodeDataset:
    """The offline dataset of the env's task, restricted to the env's features and one split.

    The importer named by `dataset_cfg.format` finds/downloads and converts the data on first use (e.g.
    `lerobot.datasets.pusht_import`); the env's features and fps must match what the dataset holds.

    Args:
        dataset_cfg: where the data lives, `val_fraction`, `split_seed`.
        env_cfg: the env whose features (names and shapes) the dataset must provide, plus `action`.
        delta_timestamps: feature -> offsets in seconds (see `EpisodeDataset`).
        split: "train" or "val". Both use statistics of the training episodes.
        keys: extra features to load, e.g. `next.reward`, `next.done` for RL.
        tasks: the tasks to train on (the names `env.task` resolves to): only their episodes are kept, as the
            env's task feature reads them (`episodes_of_tasks`), and the split is drawn among those. None keeps
            every episode.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: expected one of {SPLITS}")
    root = import_dataset(dataset_cfg)
    wanted = list(dict.fromkeys([*env_cfg.features, ACTION, *(keys or [])]))
    probe = EpisodeDataset(root)
    # A task input the data lacks comes from each episode's task string and the feature's vocabulary.
    derived = {
        key: task_ids(probe.meta, key, feature, root)
        for key, feature in env_cfg.features.items()
        if feature.kind == TASK and key not in probe.keys and feature.names
    }
    missing = [k for k in wanted if k not in probe.keys and k not in derived]
    if missing:
        raise ConfigError(
            f"the {dataset_format(dataset_cfg)} dataset at {root} has no feature {missing} that env {env_cfg.name!r} "
            f"needs (it has {probe.keys}); pick the env the data was recorded with or another dataset.format"
        )
    for key, feature in env_cfg.features.items():
        have = tuple(derived[key].shape[1:]) if key in derived else probe.features[key]
        if tuple(feature.shape) != have:
            fix = ""
            if feature.kind == VISUAL and dataset_format(dataset_cfg) == LEROBOT_FORMAT and len(have) == 3:
                fix = f"; set dataset.image_size={list(feature.shape[1:])} to resize the frames at import"
            raise ConfigError(
                f"env.features.{key}.shape={list(feature.shape)} but the dataset at {root} has {list(have)}{fix}"
            )
    if env_cfg.fps != probe.fps:
        raise ConfigError(f"env.fps={env_cfg.fps} but the dataset at {root} was recorded at {probe.fps} fps")
    kept = (
        np.arange(probe.num_episodes) if tasks is None else episodes_of_tasks(probe, derived, env_cfg, tasks)
    )
    train, val = split_episodes(len(kept), dataset_cfg.val_fraction, dataset_cfg.split_seed)
    train, val = kept[train].tolist(), kept[val].tolist()
    if split == "val" and not val:
        raise ConfigError("split='val' needs dataset.val_fraction > 0")
    return EpisodeDataset(
        root,
        delta_timestamps=delta_timestamps,
        episodes=train if split == "train" else val,
        keys=wanted,
        stats_episodes=train,
        derived=derived,
    )


def episodes_of_tasks(
    dataset: EpisodeDataset, derived: Mapping[str, np.ndarray], env_cfg: EnvConfig, tasks: Sequence[str]
) -> np.ndarray:
    """The episodes of `dataset` (all of its episodes) whose task is one of `tasks`, sorted.

    An episode's task is its first frame's id in the env's task feature (one with a vocabulary, `names`),
    stored or `derived` (`task_ids`). Episodes of other tasks are left out (logged); a task of `tasks` that no
    episode has is a `ConfigError` naming it. Without such a feature every episode is kept (a warning).
    """
    found = [
        (key, feature) for key, feature in env_cfg.features.items() if feature.kind == TASK and feature.names
    ]
    everything = np.arange(dataset.num_episodes)
    if not found:
        log.warning(
            "env %r declares no task feature with names (a vocabulary), so the episodes' tasks are not known: "
            "training on every episode of %s",
            env_cfg.name,
            dataset.root,
        )
        return everything
    key, feature = found[0]
    ids = derived[key] if key in derived else np.load(feature_file(dataset.root, key), mmap_mode="r")
    # `dataset` holds every episode, so its item indices are the dataset's frames.
    starts = [start for start, _ in dataset.episode_ranges]
    names = list(feature.names)
    episode_tasks = [
        names[i] if 0 <= i < len(names) else f"id {i}" for i in np.asarray(ids[starts]).astype(int)
    ]
    have = sorted(set(episode_tasks))
    source = dataset.meta.get("source", {}).get(
        "path", dataset.root
    )  # the user's dataset, not its conversion
    lacking = [task for task in tasks if task not in have]
    if lacking:
        them = "it" if len(lacking) == 1 else "them"
        raise ConfigError(
            f"env.task names {', '.join(lacking)}, but the dataset at {source} holds no episode of {them} "
            f"(its tasks: {', '.join(have)}); drop {them} from env.task or train on data that has {them}"
        )
    kept = everything[[task in tasks for task in episode_tasks]]
    if len(kept) < len(everything):
        left_out = sorted(set(episode_tasks) - set(tasks))
        log.info(
            "training on the %d of %d episodes of %s whose task env.task names; left out: the episodes of %s",
            len(kept),
            len(everything),
            source,
            ", ".join(left_out),
        )
    return kept


def task_ids(meta: Mapping[str, Any], key: str, feature: FeatureConfig, root: Path) -> np.ndarray:
    """The id of each frame's task in the vocabulary of task feature `key`, from each episode's task string.

    The rule, for a dataset that records its episodes' tasks (LeRobot's task table, kept by the importer in
    `meta.json`) but not the feature itself: an episode's task string is looked up among `feature.names`
    (id i is `names[i]`), else among `feature.descriptions` (name -> the sentence a dataset may use instead).
    Every episode must have one task, and its string must name exactly one id.

    Args:
        meta: the converted dataset's `meta.json` (`tasks`, `episode_tasks`, `episode_ends`).
        key: the feature (batch key), e.g. `observation.task_index`.
        feature: its config: shape [], `names`, optional `descriptions` and `high`.
        root: the converted dataset, for messages.

    Returns:
        (num_frames,) int64 ids, episodes one after another.

    Raises:
        ConfigError: a vocabulary that does not fit the feature, a dataset recording no tasks or several in one
            episode, or a task string that names no id or several (one line naming the string, its episodes and
            what was expected).
    """
    names = list(feature.names or [])
    descriptions = dict(feature.descriptions or {})
    where = f"env.features.{key}"
    if list(feature.shape) != [] or len(set(names)) != len(names):
        raise ConfigError(
            f"{where}: a task vocabulary needs shape [] and distinct names, got shape {list(feature.shape)}"
        )
    if feature.high and int(max(feature.high)) != len(names) - 1:
        raise ConfigError(
            f"{where}.high={list(feature.high)} but its names number {len(names)} ids (0..{len(names) - 1})"
        )
    unknown = [name for name in descriptions if name not in names]
    if unknown:
        raise ConfigError(f"{where}.descriptions describes {unknown}, which are not among its names")
    tasks, episode_tasks = meta.get("tasks"), meta.get("episode_tasks")
    if tasks is None or episode_tasks is None:
        raise ConfigError(
            f"the dataset at {root} has no feature {key!r} and records no task per episode to derive it from; "
            "use a LeRobotDataset with a task table (meta/tasks) or one recorded with the feature"
        )
    by_name = {name: i for i, name in enumerate(names)}
    by_description: dict[str, list[str]] = {}
    for name, text in descriptions.items():
        by_description.setdefault(text, []).append(name)
    ids = np.empty(len(tasks), dtype=np.int64)
    episodes_of = {t: [e for e, ts in enumerate(episode_tasks) if t in ts] for t in range(len(tasks))}
    for t, text in enumerate(tasks):
        if not episodes_of[t]:
            ids[t] = -1  # in the table, in no episode: nothing to resolve
            continue
        found = [text] if text in by_name else by_description.get(text, [])
        episodes = _some(episodes_of[t])
        if not found:
            raise ConfigError(
                f"task {text!r} of episodes {episodes} in the dataset at {root} is not a task of {where}: expected "
                f"one of its names (e.g. {names[0]!r}) or descriptions (e.g. {next(iter(by_description), None)!r})"
            )
        if len(found) > 1:
            raise ConfigError(
                f"task {text!r} of episodes {episodes} in the dataset at {root} describes {len(found)} tasks of "
                f"{where} ({', '.join(sorted(found))}), so it names none; give those episodes a task name in the "
                f"dataset's task table or drop all but one of these from {where}.descriptions"
            )
        ids[t] = by_name[found[0]]
    several = [e for e, ts in enumerate(episode_tasks) if len(ts) != 1]
    if several:
        raise ConfigError(
            f"episodes {_some(several)} of the dataset at {root} have {len(episode_tasks[several[0]])} tasks; "
            f"{where} takes one task per episode"
        )
    lengths = np.diff(np.asarray([0, *meta["episode_ends"]], dtype=np.int64))
    return np.repeat(ids[[ts[0] for ts in episode_tasks]], lengths)


def _some(items: Sequence[int], shown: int = 5) -> str:
    """`[1, 2, 3]`, or the first `shown` items and how many more."""
    head = ", ".join(map(str, items[:shown]))
    return f"[{head}]" if len(items) <= shown else f"[{head}, ... {len(items) - shown} more]"


class StepBatchSampler(Sampler[list[int]]):
    """Batches of item indices addressed by global step; batch `s` depends only on `(seed, s)`.

    Args:
        num_samples: dataset length.
        batch_size: items per batch.
        seed: data-order seed.
        shuffle: permute items each epoch (else sequential order).
        drop_last: drop each epoch's incomplete last batch (so every batch has `batch_size` items).
        start_step: first step to yield.
        num_steps: how many steps to yield, crossing epochs as needed; None: until the end of the epoch that
            contains `start_step` (from step 0 that is one ordinary epoch).
        infinite: yield forever (ignores `num_steps`); `len()` is then undefined.
        shard: `(index, count)`: yield only shard `index` of `count` equal, contiguous slices of each batch
            (data-parallel training: `batch_size` is the global batch, each process loads its slice).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
        start_step: int = 0,
        num_steps: int | None = None,
        infinite: bool = False,
        shard: tuple[int, int] = (0, 1),
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if start_step < 0 or (num_steps is not None and num_steps < 0):
            raise ValueError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.steps_per_epoch = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
        if self.steps_per_epoch < 1:  # a batch size the dataset cannot fill: the user's setting to lower
            raise ConfigError(
                f"{num_samples} samples make no full batch of {batch_size} (drop_last=True): the dataset holds "
                f"fewer samples than training.batch_size={batch_size}; set training.batch_size to at most "
                f"{num_samples}"
            )
        self.start_step = start_step
        if num_steps is None:
            num_steps = (start_step // self.steps_per_epoch + 1) * self.steps_per_epoch - start_step
        self.num_steps = num_steps
        self.infinite = infinite
        index, count = shard
        if batch_size % count or not 0 <= index < count:
            raise ValueError(f"shard {index} of {count} does not split batch_size={batch_size} evenly")
        self.shard_size = batch_size // count
        self.shard_start = index * self.shard_size
        self._epoch, self._order = -1, np.arange(num_samples)

    def order(self, epoch: int) -> np.ndarray:
        """Item order (num_samples,) of `epoch`."""
        if epoch != self._epoch:
            self._epoch = epoch
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        return self._order

    def batch(self, step: int) -> list[int]:
        """Item indices of global step `step` (this shard's slice of them)."""
        epoch, slot = divmod(step, self.steps_per_epoch)
        start = slot * self.batch_size + self.shard_start
        return self.order(epoch)[start : start + self.shard_size].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while self.infinite or step < self.start_step + self.num_steps:
            yield self.batch(step)
            step += 1

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("an infinite StepBatchSampler has no length")
        return self.num_steps


def make_dataloader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool = False,
    **order: Any,
) -> DataLoader:
    """A DataLoader whose batches are fixed by `(seed, step)` (see `StepBatchSampler` and the module doc).

    Args:
        dataset: an `EpisodeDataset` (batched `__getitems__`) or any map-style dataset.
        batch_size, num_workers, pin_memory: as in `torch.utils.data.DataLoader`.
        seed: data-order seed.
        order: `StepBatchSampler`'s keyword arguments: `shuffle`, `drop_last`, `start_step` (resume at step k:
            `start_step=k`), `num_steps` (batches to produce, which may span epochs; None: to the end of the
            current epoch), `infinite` (batches forever, `len()` undefined; see `cycle_batches`) and `shard`
            (`(index, count)`: load only that slice of each batch).

    Returns:
        A DataLoader yielding dicts of batched tensors (B, ...), `len()` = number of batches.
    """
    return DataLoader(
        dataset,
        batch_sampler=StepBatchSampler(len(dataset), batch_size, seed, **order),
        num_workers=num_workers,
        collate_fn=collate_batch,
        pin_memory=pin_memory and torch.cuda.is_available(),
        persistent_workers=False,
        worker_init_fn=ignore_stop_signals,
    )


def cycle_batches(
    dataset: Dataset,
    batch_size: int,
    seed: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    **order: Any,
) -> Iterator[dict[str, Any]]:
    """Endless iterator over training batches; its n-th batch is global step `start_step + n`.

    Resuming at step k with the same seed yields exactly what an uninterrupted run yields from step k.
    Workers (if any) start at the first `next()` and live as long as the iterator. `order`: as in
    `make_dataloader` (`start_step`, `shuffle`, `drop_last`, `shard`: with `shard=(i, n)` the batches are
    slice i of n of those global batches).
    """
    loader = make_dataloader(dataset, batch_size, num_workers, seed, pin_memory, infinite=True, **order)
    return iter(loader)
