"""Evaluated episodes as a dataset: what `scripts/eval.py ... eval.record_dataset=DIR` writes.

`EpisodeRecorder` keeps, for every env step of an evaluated episode, the observation the policy acted on, the
action sent to the env and what the step returned, and spills each finished episode to disk. `write` lays
the episodes, in episode order, out in the project's format and hands them to the exporter
(`export_lerobot_dataset`), so `DIR` is a LeRobotDataset v3.0 (camera observations as AV1 videos) that
LeRobot and this project (`dataset.repo_id=... dataset.root=DIR`) read. Row t of an episode holds

    observation.* (what the policy saw at step t), action (what it sent), next.reward, next.success,
    next.done (what that step returned; next.done is True on the episode's last row), episode.seed

the layout of the PushT demonstrations. Nothing is left behind: the spill directory is a `TemporaryDir`
beside `DIR`, and the dataset appears in one rename at the end of the export; the temporaries a killed
recording left (`.<name>.episodes.tmp-*`, `.<name>.converted.tmp-*`) are deleted by the next recording beside
them (`remove_stale_recordings`).

A full disk does not cost the evaluation: the recorder stops recording at the first episode that does not
fit, frees what it spilled and keeps the error (`EpisodeRecorder.error`), which `write` raises; the
evaluation's own figures are written all the same. Nor does another recording into the same `DIR` that
finished first: its dataset is kept (the export never replaces a `DIR` that appeared meanwhile; `write`
raises `DatasetExistsError`), and so are this evaluation's figures.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from lerobot.constants import ACTION, ACTION_KIND, ENV_STATE, OBS_ENV_STATE, OBS_STATE, STATE, VISUAL
from lerobot.datasets.format import (
    EPISODE_INDEX,
    EPISODE_STATS_FILE,
    FRAME_INDEX,
    TIMESTAMP,
    feature_file,
    open_preallocated_memmap,
    stack_episode_stats,
    sufficient_stats,
    uint8_channel_stats,
    write_meta,
)
from lerobot.datasets.lerobot_export import export_lerobot_dataset
from lerobot.envs.tasks import EpisodeSpec
from lerobot.errors import DatasetError
from lerobot.runtime.files import TemporaryDir, no_space_error, remove_stale_temporary_dirs

log = logging.getLogger(__name__)

NEXT_REWARD, NEXT_SUCCESS, NEXT_DONE = "next.reward", "next.success", "next.done"
EPISODE_SEED = "episode.seed"
_KINDS = {OBS_STATE: STATE, OBS_ENV_STATE: ENV_STATE, ACTION: ACTION_KIND}
# The `TemporaryDir`s a recording into DIR makes beside it: the spilled episodes, then the converted dataset.
SPILL, CONVERTED = "episodes", "converted"


def spill_dir(out_dir: Path | str) -> Path:
    """The final name of the spill `TemporaryDir` of a recording into `out_dir` (`<out_dir>.episodes`)."""
    return Path(out_dir).parent / f"{Path(out_dir).name}.{SPILL}"


def remove_stale_recordings(out_dir: Path | str) -> None:
    """Delete the temporaries that killed recordings into `out_dir` left beside it (spilled episodes, converted
    datasets; those of a recording still running are left alone), saying how much was freed."""
    out_dir = Path(out_dir)
    removed, freed = 0, 0
    for name in (SPILL, CONVERTED):
        n, size = remove_stale_temporary_dirs(out_dir.parent / f"{out_dir.name}.{name}")
        removed, freed = removed + n, freed + size
    if removed:
        log.info("removed %d temporaries of killed recordings of %s (%.1f MB)", removed, out_dir, freed / 1e6)


class EpisodeRecorder:
    """Steps of evaluated episodes, collected per env slot and spilled to `work_dir` episode by episode.

    Call `observe(slots, episodes, obs, action)` before each env step with the slots that run an episode,
    `outcome(reward, success, done)` after it, and `finish(slots)` for the slots whose episode ended.
    """

    def __init__(self, work_dir: Path):
        self.dir = Path(work_dir)
        self.open: dict[int, dict[str, list[np.ndarray]]] = {}  # slot -> key -> rows of its episode
        self.slot_episode: dict[int, tuple[int, EpisodeSpec]] = {}  # slot -> (episode index, its spec)
        self.lengths: dict[int, int] = {}  # finished episode -> steps
        self.tasks: dict[int, str | None] = {}  # finished episode -> its task (None: a single-task env)
        self._stepped: np.ndarray | None = None
        # The full disk (OSError naming the file) that stopped the recording; from then on it records nothing.
        self.error: OSError | None = None

    def observe(
        self,
        slots: np.ndarray,
        episodes: list[tuple[int, EpisodeSpec]],
        obs: dict[str, np.ndarray],
        action: np.ndarray,
    ) -> None:
        """The observation each of `slots` acted on and its action; `episodes` are their (index, spec)."""
        if self.error is not None:
            return
        for slot, episode in zip(slots.tolist(), episodes, strict=True):
            if self.slot_episode.get(slot) != episode:  # the slot began this episode
                self.slot_episode[slot] = episode
                self.open[slot] = {}
            rows = self.open[slot]
            for key, value in obs.items():
                # A copy: the vector env may reuse its observation buffers at the next step.
                rows.setdefault(key, []).append(np.array(value[slot]))
            rows.setdefault(ACTION, []).append(np.array(action[slot], dtype=np.float32))
        self._stepped = slots

    def outcome(self, reward: np.ndarray, success: np.ndarray, done: np.ndarray) -> None:
        """What the step just taken returned, (num_envs,) each, for the slots of the last `observe`."""
        if self.error is not None:
            return
        for slot in self._stepped.tolist():
            rows = self.open[slot]
            rows.setdefault(NEXT_REWARD, []).append(np.float32(reward[slot]))
            rows.setdefault(NEXT_SUCCESS, []).append(np.bool_(success[slot]))
            rows.setdefault(NEXT_DONE, []).append(np.bool_(done[slot]))

    def finish(self, slots: np.ndarray) -> None:
        """Spill the episodes that `slots` ended to `work_dir/<episode>/<key>.npy`.

        On a full disk the recording stops (`error`) and what it spilled is deleted, which gives the space
        back to the rest of the evaluation; any other write error is raised.
        """
        if self.error is not None:
            return
        try:
            for slot in slots.tolist():
                self._spill(self.open.pop(slot), *self.slot_episode.pop(slot))
        except OSError as e:
            full = no_space_error(e)
            if full is None:
                raise
            self.error = full
            self.open.clear()
            self.slot_episode.clear()
            self.lengths.clear()
            for episode in list(self.dir.iterdir()):
                shutil.rmtree(episode, ignore_errors=True)
            log.warning("stopped recording the episodes: %s writing %s", full.strerror, full.filename)

    def _spill(self, rows: dict[str, list[np.ndarray]], index: int, spec: EpisodeSpec) -> None:
        """Write one finished episode's `rows` to `work_dir/<index>/<key>.npy`."""
        out = self.dir / f"{index:09d}"
        out.mkdir(parents=True)
        length = len(rows[ACTION])
        rows[EPISODE_SEED] = [np.int64(spec.seed)] * length
        for key, values in rows.items():
            array = np.stack(values)
            if array.ndim == 4 and array.dtype == np.uint8:  # (T, H, W, C) camera -> (T, C, H, W)
                array = np.ascontiguousarray(array.transpose(0, 3, 1, 2))
            elif array.dtype == np.float64:
                array = array.astype(np.float32)
            _save_npy(out / f"{key}.npy", array)
        self.lengths[index] = length
        self.tasks[index] = spec.task

    def write(self, out_dir: Path | str, fps: int, task: str, name: str) -> Path:
        """Write the finished episodes, in episode order, as a LeRobotDataset v3.0 at `out_dir`; each episode's
        LeRobot `task` is its own task (multi-task envs), else `task`. Raises the recorder's `error` (a full
        disk while spilling) when it stopped recording."""
        if self.error is not None:
            raise self.error
        if not self.lengths:
            raise DatasetError(f"{out_dir}: no finished episode to record")
        out_dir = Path(out_dir)
        with TemporaryDir(out_dir.parent / f"{out_dir.name}.{CONVERTED}") as converting:
            converted = converting.path
            _write_converted(self.dir, sorted(self.lengths), self.lengths, converted, fps, name)
            tasks = [self.tasks[e] or task for e in sorted(self.lengths)]
            return export_lerobot_dataset(converted, out_dir, task=tasks)


class _Stream:
    """A file that numpy writes through `write` like any stream: its own writes to real files (`tofile`, C
    stdio) report a full disk as "N requested and M written", without the errno that says the disk is full."""

    def __init__(self, file):
        self.write = file.write


def _save_npy(path: Path, array: np.ndarray) -> None:
    """`np.save(path, array)`; a failed write is an OSError naming `path`, with its errno."""
    try:
        with open(path, "wb") as f:
            np.lib.format.write_array(_Stream(f), array, allow_pickle=False)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e


def _write_converted(
    spill: Path, order: list[int], lengths: dict[int, int], out: Path, fps: int, name: str
) -> None:
    """The spilled episodes `order` as a dataset in the project's format at `out`."""
    ends = np.cumsum([lengths[e] for e in order])
    starts = ends - np.array([lengths[e] for e in order])
    first = spill / f"{order[0]:09d}"
    keys = sorted(p.stem for p in first.glob("*.npy"))
    features, per_episode = {}, {}
    for key in keys:
        sample = np.load(first / f"{key}.npy", mmap_mode="r")
        image = sample.ndim == 4 and sample.dtype == np.uint8
        target = open_preallocated_memmap(
            feature_file(out, key), sample.dtype, (int(ends[-1]), *sample.shape[1:])
        )
        stats = []
        for episode, start, end in zip(order, starts, ends):
            values = np.load(spill / f"{episode:09d}" / f"{key}.npy")
            if values.shape[1:] != sample.shape[1:]:
                raise DatasetError(
                    f"episode {episode}: {key!r} has shape {values.shape[1:]}, not {sample.shape[1:]}"
                )
            target[start:end] = values
            stats.append(uint8_channel_stats(values) if image else sufficient_stats(values))
        target.flush()
        del target
        per_episode[key] = stack_episode_stats(stats)
        kind = VISUAL if image else _KINDS.get(key, "other")
        features[key] = {"shape": list(sample.shape[1:]), "dtype": str(sample.dtype), "kind": kind}
    episode_index = np.repeat(np.arange(len(order)), ends - starts)
    frame_index = np.arange(int(ends[-1])) - starts[episode_index]
    bookkeeping = {
        EPISODE_INDEX: episode_index.astype(np.int64),
        FRAME_INDEX: frame_index.astype(np.int64),
        TIMESTAMP: (frame_index / fps).astype(np.float32),
    }
    for key, values in bookkeeping.items():
        np.save(feature_file(out, key), values)
        features[key] = {"shape": [], "dtype": str(values.dtype), "kind": "other"}
    save_file(
        {f"{k}/{n}": a for k, st in per_episode.items() for n, a in st.items()}, out / EPISODE_STATS_FILE
    )
    write_meta(out, name, fps, ends, features, source={"recorded_episodes": order})
