"""Episodes of a converted dataset as a rerun recording (`.rrd`), for rerun's viewer: `rerun FILE.rrd`.

Needs the optional `rerun-sdk` (`pip install -e ".[viz]"`); without it `write_rerun` raises `InstallError`,
one line saying so. Each episode is its own entity tree (`episode_<i>/<feature>/<dimension name>`) on the
timelines `frame_index` and `time`; cameras are logged as images, every other feature as scalars.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from lerobot.datasets.episode_dataset import EpisodeDataset
from lerobot.datasets.format import read_meta
from lerobot.errors import InstallError
from lerobot.reports.dataset_viewer import viewer_layout

RERUN_MISSING = '--rerun needs the rerun-sdk package: pip install -e ".[viz]" (or pip install rerun-sdk)'


def import_rerun() -> Any:
    """The `rerun` module, or `InstallError` with the install command."""
    try:
        import rerun
    except ImportError:
        raise InstallError(RERUN_MISSING) from None
    return rerun


def entity_part(name: str) -> str:
    """`name` as one part of a rerun entity path: characters other than letters, digits, `_`, `-` and `.`
    (a `/` would nest, brackets and spaces need escaping) become `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def dimension_paths(key: str, names: list[str]) -> list[str]:
    """The entity path of each dimension of feature `key`: `key` itself for a scalar, `key/<name>` for a named
    dimension, `key/<i>` for one without a name (`viewer_layout` calls it `key[i]`)."""
    if names == [key]:
        return [entity_part(key)]
    return [
        f"{entity_part(key)}/{i if name == f'{key}[{i}]' else entity_part(name)}"
        for i, name in enumerate(names)
    ]


def _set_time(rec: Any, rr: Any, frame: int, fps: int) -> None:
    """Place the next logs at `frame` (rerun >= 0.23 has `set_time`; older ones named each kind of time)."""
    if hasattr(rec, "set_time"):
        rec.set_time("frame_index", sequence=frame)
        rec.set_time("time", duration=timedelta(seconds=frame / fps))
    else:
        rec.set_time_sequence("frame_index", frame)
        rec.set_time_seconds("time", frame / fps)


def _scalar(rr: Any, value: float) -> Any:
    """One scalar sample (`Scalars` since rerun 0.23, `Scalar` before)."""
    return rr.Scalars(value) if hasattr(rr, "Scalars") else rr.Scalar(value)


def write_rerun(root: Path | str, path: Path | str, episodes: Sequence[int]) -> Path:
    """Write `episodes` of the converted dataset `root` into the rerun recording `path`; return it."""
    rr = import_rerun()
    layout = viewer_layout(read_meta(root))
    dataset = EpisodeDataset(root, episodes=episodes, keys=[*layout.cameras, *layout.plotted])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = rr.RecordingStream("lerobot_dataset")
    rec.save(str(path))
    try:
        for episode, (start, end) in zip(dataset.episodes.tolist(), dataset.episode_ranges):
            _log_episode(rec, rr, dataset, layout, episode, (start, end))
    finally:
        rec.disconnect()  # flushes what is buffered into the file
    return path


def _log_episode(
    rec: Any, rr: Any, dataset: EpisodeDataset, layout: Any, episode: int, item_range: tuple[int, int]
) -> None:
    """Log one episode's frames: images of each camera, one scalar per dimension of the other features."""
    for item in range(*item_range):
        frame = dataset.__getitems__([item])
        _set_time(rec, rr, item - item_range[0], dataset.fps)
        for camera in layout.cameras:
            image = np.rint(frame[camera][0].numpy() * 255.0).astype(np.uint8).transpose(1, 2, 0)
            rec.log(f"episode_{episode}/{entity_part(camera)}", rr.Image(image))
        for key in layout.plotted:
            values = frame[key][0].numpy().reshape(-1)
            for path, value in zip(dimension_paths(key, layout.names[key]), values.tolist()):
                rec.log(f"episode_{episode}/{path}", _scalar(rr, value))
