"""`EpisodeDataset`: frames of recorded episodes, optionally as windows of frames (`delta_timestamps`).

The arrays of a converted dataset (see `lerobot.datasets.format`) are memory-mapped (or loaded into RAM) and
indexed with numpy: a batch is one gather per feature, with no per-item decoding or Python loop. A
`DataLoader` calls `__getitems__` with a whole batch of indices; use `make_dataloader` (or pass
`collate_fn=collate_batch`), because the batch comes back already stacked.

Windows: with `delta_timestamps={"action": [-0.1, 0.0, 0.1]}`, item `i` holds `action` at frames
`t-1, t, t+1` of the episode of frame `t`, stacked on a new leading axis, and `action_is_pad` (3,) marks the
offsets that fall outside the episode; those frames are filled with the episode's first/last frame, so a
window never reads another episode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from lerobot.constants import INDEX, PAD_SUFFIX
from lerobot.datasets.format import (
    BOOKKEEPING_KEYS,
    EPISODE_INDEX,
    EPISODE_STATS_FILE,
    FRAME_INDEX,
    TIMESTAMP,
    check_against_episode_stats,
    combine_stats,
    feature_file,
    load_episode_stats,
    read_meta,
    stack_episode_stats,
    stats_to_tensors,
    sufficient_stats,
)
from lerobot.errors import DatasetError, DeltaTimestampsError

# Offsets closer than this (in frames) to a whole number of frames count as whole: 0.1 * 10 is not 1.0
# exactly in floating point, and timestamps in configs are written with a few decimals.
_FRAME_TOLERANCE = 1e-4


class EpisodeDataset(Dataset):
    """A torch Dataset over the frames of chosen episodes of a converted dataset.

    Args:
        root: directory of a converted dataset (holds `meta.json`).
        delta_timestamps: feature -> offsets in seconds (multiples of 1/fps); each listed feature is returned
            as a window (T, ...) with `{feature}_is_pad` (T,) bool.
        episodes: episode indices to serve (default: all), e.g. the training split.
        keys: features to load (default: every feature of the dataset).
        stats_episodes: episodes the statistics are computed over (default: `episodes`); the validation
            split passes the training episodes here so both splits normalize alike.
        in_memory: read the arrays into RAM instead of memory-mapping them.
        derived: feature -> (num_frames, *shape) array over all frames of the dataset, served like a stored
            feature (windows, statistics): features computed when the dataset is opened, e.g. a task id
            from each episode's task string (`lerobot.datasets.factory.task_ids`).

    Opening checks every loaded numeric (non-image) array against the per-episode min/max written at
    conversion, so a file changed or damaged since (NaN, 1e30) is a `DatasetError` naming the file, episode
    and frame, not a NaN loss later (one pass over the numeric arrays; images are uint8 and hold no NaN).

    An item is a dict of tensors: images float32 (3, H, W) in [0, 1], other features float32 of their
    shape (booleans as 0/1), windows with a leading T axis, plus `episode_index`, `frame_index`, `index`
    (int64) and `timestamp` (float32) of the frame itself.
    """

    def __init__(
        self,
        root: Path | str,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | None = None,
        keys: Sequence[str] | None = None,
        stats_episodes: Sequence[int] | None = None,
        in_memory: bool = False,
        derived: Mapping[str, np.ndarray] | None = None,
    ):
        self.root = Path(root)
        self.in_memory = in_memory
        self.meta = read_meta(self.root)
        self._derived = {k: np.asarray(v) for k, v in (derived or {}).items()}
        for key, values in self._derived.items():
            if len(values) != self.meta["num_frames"]:
                raise ValueError(
                    f"derived feature {key!r} has {len(values)} frames, the dataset {self.meta['num_frames']}"
                )
            self.meta["features"][key] = {
                "shape": list(values.shape[1:]),
                "dtype": str(values.dtype),
                "kind": "other",
            }
        self._fps = int(self.meta["fps"])
        ends = np.asarray(self.meta["episode_ends"], dtype=np.int64)
        self._all_starts = np.concatenate([[0], ends[:-1]])
        self._all_ends = ends
        total_episodes = len(ends)

        self.episodes = self._check_episodes(episodes, total_episodes, "episodes")
        self.stats_episodes = (
            self.episodes
            if stats_episodes is None
            else self._check_episodes(stats_episodes, total_episodes, "stats_episodes")
        )
        features = self.meta["features"]
        data_keys = [k for k in features if k not in BOOKKEEPING_KEYS]
        self.keys = list(data_keys if keys is None else dict.fromkeys(keys))
        unknown = [k for k in self.keys if k not in data_keys]
        if unknown:
            raise KeyError(f"{self.root}: no feature {unknown}; available: {data_keys}")
        self._delta_frames = _delta_frames(delta_timestamps, self._fps, self.keys)
        # Plain dict of float lists (configs may pass OmegaConf containers).
        self.delta_timestamps = {k: [float(v) for v in delta_timestamps[k]] for k in self._delta_frames}

        # Dataset index -> global frame, and the [start, end) of that frame's episode.
        starts, stops = self._all_starts[self.episodes], self._all_ends[self.episodes]
        lengths = stops - starts
        self._frames = np.concatenate([np.arange(s, e) for s, e in zip(starts, stops)]).astype(np.int64)
        self._ep_start = np.repeat(starts, lengths)
        self._ep_end = np.repeat(stops, lengths)

        self._arrays: dict[str, np.ndarray] = {}
        self._open_arrays()
        self._episode_stats = load_episode_stats(self.root)
        for key, values in self._derived.items():
            bounds = zip(self._all_starts, self._all_ends)
            stacked = stack_episode_stats([sufficient_stats(values[s:e]) for s, e in bounds])
            self._episode_stats.update({f"{key}/{n}": v for n, v in stacked.items()})
        self._check_values()
        self._stats: dict[str, dict[str, torch.Tensor]] | None = None

    # ------------------------------------------------------------------------------------------- loading

    @staticmethod
    def _check_episodes(episodes: Sequence[int] | None, total: int, name: str) -> np.ndarray:
        if episodes is None:
            return np.arange(total, dtype=np.int64)
        eps = np.asarray(list(episodes), dtype=np.int64)
        if len(eps) == 0:
            raise ValueError(f"{name} is empty")
        if eps.min() < 0 or eps.max() >= total:
            raise ValueError(f"{name} must lie in [0, {total}); got min {eps.min()}, max {eps.max()}")
        if len(np.unique(eps)) != len(eps):
            raise ValueError(f"{name} lists an episode twice")
        return np.sort(eps)

    def _open_arrays(self) -> None:
        """Memory-map (or read) every needed `.npy` and check its shape and dtype against `meta.json`."""
        num_frames = int(self.meta["num_frames"])
        for key in [*self.keys, *BOOKKEEPING_KEYS]:
            if key in self._derived:
                self._arrays[key] = self._derived[key]
                continue
            path = feature_file(self.root, key)
            info = self.meta["features"][key]
            try:
                arr = np.load(path, mmap_mode=None if self.in_memory else "r", allow_pickle=False)
            except FileNotFoundError:
                raise DatasetError(f"{path}: missing; delete {self.root} to convert again") from None
            except (ValueError, OSError, EOFError) as e:
                raise DatasetError(
                    f"{path}: truncated or corrupt array ({e}); delete {self.root} to convert again"
                ) from None
            expected = (num_frames, *info["shape"])
            if arr.shape != expected or str(arr.dtype) != info["dtype"]:
                raise DatasetError(
                    f"{path}: holds {arr.dtype} {arr.shape}, meta.json says {info['dtype']} {expected}"
                )
            self._arrays[key] = arr

    def _check_values(self) -> None:
        """Check the loaded numeric features against their per-episode min/max (see the class docstring)."""
        for key in self.keys:
            values = self._arrays[key]
            stats = {n: self._episode_stats.get(f"{key}/{n}") for n in ("min", "max")}
            # Features without statistics cannot be normalized either: `stats` names them when asked.
            if self._is_image(key) or values.dtype == np.bool_ or any(v is None for v in stats.values()):
                continue
            check_against_episode_stats(
                feature_file(self.root, key),
                values,
                stats,
                self._all_ends,
                self.root,
            )

    def __getstate__(self) -> dict[str, Any]:
        # Memory maps would be pickled as full copies when workers are spawned; reopen them there instead.
        state = self.__dict__.copy()
        state["_arrays"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_arrays()

    # ---------------------------------------------------------------------------------------- properties

    @property
    def fps(self) -> int:
        """Frames per second of the recording."""
        return self._fps

    @property
    def features(self) -> dict[str, tuple[int, ...]]:
        """Loaded feature -> shape of one frame as returned (images (3, H, W)), without a window axis."""
        return {k: tuple(self.meta["features"][k]["shape"]) for k in self.keys}

    @property
    def num_frames(self) -> int:
        """Number of frames (items) in the chosen episodes."""
        return len(self._frames)

    @property
    def num_episodes(self) -> int:
        """Number of chosen episodes."""
        return len(self.episodes)

    @property
    def episode_ranges(self) -> list[tuple[int, int]]:
        """(first item, end item) of each chosen episode in this dataset's own indexing."""
        lengths = self._all_ends[self.episodes] - self._all_starts[self.episodes]
        ends = np.cumsum(lengths)
        return [(int(e - n), int(e)) for e, n in zip(ends, lengths)]

    @property
    def stats(self) -> dict[str, dict[str, torch.Tensor]]:
        """Feature -> {"mean", "std", "min", "max"} float32 tensors over the frames of `stats_episodes`.

        Images: per channel, shape (3, 1, 1), in the [0, 1] scale items use. Others: the feature's shape.
        std is the population standard deviation (ddof=0).
        """
        if self._stats is None:
            path = self.root / EPISODE_STATS_FILE
            per_episode = self._episode_stats
            self._stats = {}
            for key in self.keys:
                names = ("count", "sum", "sumsq", "min", "max")
                missing = [n for n in names if f"{key}/{n}" not in per_episode]
                if missing:
                    raise DatasetError(f"{path}: no statistics {missing} for feature {key!r}")
                combined = combine_stats({n: per_episode[f"{key}/{n}"] for n in names}, self.stats_episodes)
                self._stats[key] = stats_to_tensors(combined, image=self._is_image(key))
        return self._stats

    def _is_image(self, key: str) -> bool:
        return self.meta["features"][key].get("kind") == "visual"

    # ------------------------------------------------------------------------------------------ fetching

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """One item; see the class docstring. Prefer batches (`__getitems__`) for speed."""
        batch = self.__getitems__([index])
        return {k: v[0] for k, v in batch.items()}

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor]:
        """A whole batch at once: one numpy gather per feature over all items and window offsets.

        Args:
            indices: (B,) item indices (negative ones count from the end).

        Returns:
            Batched dict: images (B, 3, H, W) or (B, T, 3, H, W) float32 in [0, 1]; other features
            (B, *shape) or (B, T, *shape) float32; `{key}_is_pad` (B, T) bool for windowed keys;
            `episode_index`, `frame_index`, `index` (B,) int64; `timestamp` (B,) float32.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self._frames)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range for a dataset of {n} frames: {idx.min()}..{idx.max()}")
        idx = np.where(idx < 0, idx + n, idx)
        frames = self._frames[idx]
        batch: dict[str, torch.Tensor] = {}
        for key in self.keys:
            offsets = self._delta_frames.get(key)
            if offsets is None:
                batch[key] = self._to_tensor(key, self._gather(key, frames))
                continue
            wanted = frames[:, None] + offsets[None, :]
            first, end = self._ep_start[idx][:, None], self._ep_end[idx][:, None]
            is_pad = (wanted < first) | (wanted >= end)
            clamped = np.clip(wanted, first, end - 1)
            values = self._gather(key, clamped.reshape(-1))
            batch[key] = self._to_tensor(key, values.reshape(*clamped.shape, *values.shape[1:]))
            batch[key + PAD_SUFFIX] = torch.from_numpy(is_pad)
        batch[EPISODE_INDEX] = torch.from_numpy(self._gather(EPISODE_INDEX, frames))
        batch[FRAME_INDEX] = torch.from_numpy(self._gather(FRAME_INDEX, frames))
        batch[TIMESTAMP] = torch.from_numpy(self._gather(TIMESTAMP, frames))
        batch[INDEX] = torch.from_numpy(frames)
        return batch

    def _gather(self, key: str, frames: np.ndarray) -> np.ndarray:
        # `take` copies the rows out of the memory map into an ordinary array (page cache does the rest).
        return np.asarray(np.take(self._arrays[key], frames, axis=0))

    def _to_tensor(self, key: str, values: np.ndarray) -> torch.Tensor:
        if self._is_image(key):
            # uint8 -> float32 in [0, 1], divided like the env's observations (`observation_to_batch`) so both
            # paths give identical numbers; numpy divides straight into the output, with no float temporary.
            out = _new_float_tensor(values.shape)
            np.divide(values, np.float32(255.0), out=out.numpy(), dtype=np.float32)
            return out
        if values.dtype == np.float32:
            return torch.from_numpy(values)
        out = _new_float_tensor(values.shape)
        out.numpy()[...] = values
        return out

    def __repr__(self) -> str:
        return (
            f"EpisodeDataset(root={str(self.root)!r}, episodes={self.num_episodes}, frames={self.num_frames}, "
            f"fps={self.fps}, keys={self.keys}, delta_timestamps={self.delta_timestamps})"
        )


def _new_float_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized float32 tensor; in a DataLoader worker, allocated in shared memory.

    A worker hands its batch to the main process through shared memory; writing the result there directly
    saves the copy that sending an ordinary tensor would make (the same trick as torch's `default_collate`).
    """
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.float32)
    numel = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(numel * 4)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)


def _delta_frames(
    delta_timestamps: Mapping[str, Sequence[float]] | None, fps: int, keys: Sequence[str]
) -> dict[str, np.ndarray]:
    """Check `delta_timestamps` and turn its offsets (seconds) into whole frame offsets (T,) int64."""
    if delta_timestamps is None:
        return {}
    if not isinstance(delta_timestamps, Mapping) and not hasattr(delta_timestamps, "items"):
        raise DeltaTimestampsError(
            f"delta_timestamps must map feature -> list of offsets in seconds, got {type(delta_timestamps).__name__}"
        )
    out = {}
    for key, offsets in delta_timestamps.items():
        if key not in keys:
            raise DeltaTimestampsError(
                f"delta_timestamps names {key!r}, which is not a loaded feature {list(keys)}"
            )
        if isinstance(offsets, (str, bytes)) or not hasattr(offsets, "__iter__"):
            raise DeltaTimestampsError(
                f"delta_timestamps[{key!r}] must be a list of offsets in seconds, got {offsets!r}"
            )
        values = list(offsets)
        if not values:
            raise DeltaTimestampsError(f"delta_timestamps[{key!r}] is empty")
        frames = []
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise DeltaTimestampsError(
                    f"delta_timestamps[{key!r}][{i}]={value!r} is not a number of seconds"
                )
            exact = float(value) * fps
            whole = round(exact) if math.isfinite(exact) else None
            if whole is None or abs(exact - whole) > _FRAME_TOLERANCE:
                raise DeltaTimestampsError(
                    f"delta_timestamps[{key!r}][{i}]={value} s is not a multiple of 1/fps = {1 / fps:g} s"
                )
            frames.append(whole)
        out[key] = np.asarray(frames, dtype=np.int64)
    return out


def collate_batch(data: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """DataLoader `collate_fn`: passes `__getitems__`'s already stacked batch through; stacks a list of items."""
    if isinstance(data, Mapping):
        return dict(data)
    return default_collate(data)
