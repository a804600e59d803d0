"""The dataset viewer: one folder, `index.html` plus an H.264 mp4 per episode and camera, that opens from disk.

`write_dataset_viewer(root, out_dir)` reads a converted dataset (what `lerobot.datasets.import_dataset`
returns: the PushT zarr's conversion, a LeRobotDataset's, ...) through `EpisodeDataset` and writes:

- `index.html`: the episode list (length, task, success and best reward where recorded; filterable by task),
  and for the chosen episode each camera as a `<video>` with frame stepping and a slider (frame `i` is shown
  at `(i + 0.5) / fps`), each state and action feature plotted over the episode's frames with its dimension
  names, and the `next.*` columns (reward, success, done) over time; a cursor follows the video.
- `videos/<camera>/episode_NNNNNN.mp4`: H.264 yuv420p (`lerobot.datasets.lerobot_export.encode_video`), loaded
  only when its episode is shown.

The episode list is one small inline JSON; each episode's series are an inline JSON of their own, parsed when
the episode is chosen, and decimated to at most `max_points` points per series (the frame indices kept go
with them), so a 25,000-frame dataset opens in well under a second.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lerobot.constants import VISUAL
from lerobot.datasets.episode_dataset import EpisodeDataset
from lerobot.datasets.format import BOOKKEEPING_KEYS, read_meta
from lerobot.datasets.lerobot_export import VideoEncoding, encode_video
from lerobot.reports.html import esc, json_script, page, write_page
from lerobot.reports.viewer_js import VIEWER_CSS, VIEWER_HTML, VIEWER_JS
from lerobot.runtime.files import TemporaryDir, remove_stale_temporary_dirs

log = logging.getLogger(__name__)

VIDEOS_DIR = "videos"
INDEX_FILE = "index.html"
# Prefix of the columns about the step's outcome (reward, success, done), drawn together in one chart.
OUTCOME_PREFIX = "next."
# Frames decoded per read when a camera's episode is encoded (bounds memory for large frames).
FRAMES_PER_READ = 64


class H264Encoding(VideoEncoding):
    """x264 settings for browser playback: yuv420p, a key frame every `g` frames (fast seeking), CRF 20."""

    def options(self) -> dict[str, str]:
        """Codec options for PyAV's `add_stream` (x264 names its presets)."""
        return {"g": str(self.g), "crf": str(self.crf), "preset": "veryfast"}


@dataclass(frozen=True)
class ViewerLayout:
    """Which features of a dataset the viewer shows, and how: cameras as videos, the rest as plots."""

    cameras: list[str]
    plotted: list[str]
    names: dict[str, list[str]]


def feature_names(meta: dict[str, Any], key: str, dims: int) -> list[str]:
    """The names of the `dims` dimensions of feature `key`: from `meta.json` (`features.<key>.names`), else from
    the source LeRobotDataset's `meta/info.json` when it is still at hand, else `<key>[i]`."""
    names = meta["features"][key].get("names")
    source = meta.get("source", {})
    if names is None and source.get("format") == "lerobot" and source.get("path"):
        info = Path(source["path"]) / "meta" / "info.json"
        try:
            names = json.loads(info.read_text()).get("features", {}).get(key, {}).get("names")
        except (OSError, ValueError):
            names = None
    if isinstance(names, dict):  # LeRobot's {"motors": [...]} / {"axes": [...]}
        names = [n for group in names.values() if isinstance(group, list) for n in group]
    if isinstance(names, list) and len(names) == dims and all(isinstance(n, str) for n in names):
        return names
    return [key] if dims == 1 else [f"{key}[{i}]" for i in range(dims)]


def viewer_layout(meta: dict[str, Any]) -> ViewerLayout:
    """Cameras (visual features) and plotted features (the other numeric ones, bookkeeping left out)."""
    features = meta["features"]
    cameras = [k for k, f in features.items() if f.get("kind") == VISUAL]
    plotted = [k for k, f in features.items() if f.get("kind") != VISUAL and k not in BOOKKEEPING_KEYS]
    names = {k: feature_names(meta, k, int(np.prod(features[k]["shape"] or [1]))) for k in plotted}
    return ViewerLayout(cameras, plotted, names)


def episode_tasks(meta: dict[str, Any]) -> list[str] | None:
    """Each episode's task strings joined by `; ` (LeRobot's task table, kept by the import), or None."""
    table, per_episode = meta.get("tasks"), meta.get("episode_tasks")
    if not table or per_episode is None:
        return None
    return ["; ".join(table[i] for i in ids if 0 <= i < len(table)) for ids in per_episode]


def _decimals(values: np.ndarray) -> int:
    """Decimals that keep about 4 significant digits of the largest magnitude in `values`."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 1.0
    return int(min(max(4 - math.ceil(math.log10(top)) if top > 0 else 4, 0), 6))


def episode_series(
    dataset: EpisodeDataset, item_range: tuple[int, int], layout: ViewerLayout, max_points: int
) -> dict[str, Any]:
    """One episode's plotted series as `{"n": frames, "t": kept frame indices (absent: all), "f": {key: [one
    list per dimension]}}`, each series decimated to at most `max_points` evenly spaced frames."""
    start, end = item_range
    n = end - start
    keep = np.arange(n)
    if n > max_points:
        keep = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    batch = dataset.__getitems__(start + keep) if layout.plotted else {}
    series: dict[str, Any] = {}
    for key in layout.plotted:
        values = batch[key].numpy().astype(np.float64).reshape(len(keep), -1)
        values = np.round(values, _decimals(values))
        series[key] = [[v if math.isfinite(v) else None for v in column] for column in values.T.tolist()]
    out: dict[str, Any] = {"n": n, "f": series}
    if len(keep) < n:
        out["t"] = keep.tolist()
    return out


def _outcome(series: dict[str, Any], key: str) -> list[float] | None:
    values = series["f"].get(key)
    return None if values is None else [v for v in values[0] if v is not None]


def encode_camera(dataset: EpisodeDataset, camera: str, item_range: tuple[int, int], path: Path) -> Path:
    """Encode one episode of `camera` (a dataset holding that key) as a browser-playable mp4 at `path`;
    odd frame sizes are padded to even ones (yuv420p needs them)."""

    def blocks() -> Any:
        for first in range(item_range[0], item_range[1], FRAMES_PER_READ):
            last = min(first + FRAMES_PER_READ, item_range[1])
            frames = np.rint(dataset.__getitems__(np.arange(first, last))[camera].numpy() * 255.0).astype(
                np.uint8
            )
            h, w = frames.shape[-2:]
            if h % 2 or w % 2:
                frames = np.pad(frames, ((0, 0), (0, 0), (0, h % 2), (0, w % 2)), mode="edge")
            yield frames

    path.parent.mkdir(parents=True, exist_ok=True)
    encode_video(path, blocks(), dataset.fps, H264Encoding(codec="libx264", g=max(dataset.fps, 1), crf=20))
    return path


def video_path(camera: str, episode: int) -> str:
    """Where an episode's video of `camera` lies, relative to the viewer's folder."""
    return f"{VIDEOS_DIR}/{camera}/episode_{episode:06d}.mp4"


def write_dataset_viewer(
    root: Path | str,
    out_dir: Path | str,
    episodes: Sequence[int] | None = None,
    max_points: int = 1000,
    videos: bool = True,
    title: str | None = None,
) -> Path:
    """Write the viewer of the converted dataset `root` into `out_dir`; return its `index.html`.

    Args:
        root: a converted dataset (holds `meta.json`; `lerobot.datasets.import_dataset` gives it).
        out_dir: the viewer's folder, written whole into a temporary sibling and renamed into place (an
            earlier viewer there is replaced; a stopped write leaves nothing).
        episodes: the episodes to show (default: all).
        max_points: most points drawn per series and episode.
        videos: encode the cameras' videos (False: plots only).
        title: the page's title (default: the dataset's name).
    """
    final = Path(out_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporary_dirs(final)
    with TemporaryDir(final) as tmp:
        _write_viewer(root, tmp.path, episodes, max_points, videos, title)
        tmp.install()
    return final / INDEX_FILE


def _write_viewer(
    root: Path | str,
    out_dir: Path,
    episodes: Sequence[int] | None,
    max_points: int,
    videos: bool,
    title: str | None,
) -> Path:
    """`write_dataset_viewer`'s content, written into `out_dir`."""
    plots = EpisodeDataset(root, episodes=episodes, keys=viewer_layout(read_meta(root)).plotted)
    meta, layout = plots.meta, viewer_layout(plots.meta)
    tasks = episode_tasks(meta)
    cams = {c: EpisodeDataset(root, episodes=episodes, keys=[c]) for c in layout.cameras} if videos else {}
    rows, blobs = [], []
    for position, (episode, item_range) in enumerate(zip(plots.episodes.tolist(), plots.episode_ranges)):
        series = episode_series(plots, item_range, layout, max_points)
        success, reward = _outcome(series, "next.success"), _outcome(series, "next.reward")
        row = {
            "i": episode,
            "n": series["n"],
            "task": tasks[episode] if tasks else None,
            "success": bool(max(success)) if success else None,
            "reward": max(reward) if reward else None,
            "videos": {},
        }
        for camera, dataset in cams.items():
            encode_camera(
                dataset, camera, dataset.episode_ranges[position], out_dir / video_path(camera, episode)
            )
            row["videos"][camera] = video_path(camera, episode)
        rows.append(row)
        blobs.append(json_script(f"ep-{episode}", series))
        if videos and layout.cameras and (position + 1) % 50 == 0:
            log.info("viewer: encoded %d of %d episodes", position + 1, plots.num_episodes)
    index = {
        "name": title or meta.get("name") or Path(root).name,
        "root": str(root),
        "fps": plots.fps,
        "frames": int(sum(r["n"] for r in rows)),
        "cameras": list(cams),
        "features": [
            {"key": k, "names": layout.names[k], "outcome": k.startswith(OUTCOME_PREFIX)}
            for k in layout.plotted
        ],
        "episodes": rows,
    }
    body = VIEWER_HTML.format(title=esc(index["name"])) + json_script("index", index) + "".join(blobs)
    html = page(
        f"{index['name']}: dataset viewer", body, script=VIEWER_JS, head=f"<style>{VIEWER_CSS}</style>"
    )
    return write_page(out_dir / INDEX_FILE, html)
