"""The videos of an evaluation: frames of its first episodes, each written to mp4 when the episode ends.

`eval_policy` (lerobot/rollout.py) renders only the slots that run a recorded episode, through the `render`
it gives `EpisodeVideos`; a background thread encodes each finished episode while the rollout goes on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from gymnasium.vector import VectorEnv

from lerobot.runtime.files import atomic_write, no_space_error


class _VideoAbortedError(Exception):
    """A video write stopped because the evaluation ended (Ctrl-C, an error) before it was done."""


def _write_video(path: Path, frames: list[np.ndarray], fps: int, stop: threading.Event | None = None) -> Path:
    """Write the (H, W, 3) uint8 `frames` as the H.264 mp4 `path`, whole or not at all (`atomic_write`).

    PyAV encodes in this process, so a failed write (a full disk) raises, at the latest in `close`, which
    flushes the muxer and writes the file's index, and so before the rename. After a failure the container
    is closed with its own errors suppressed: they repeat the first one, which is what propagates. Once
    `stop` is set the write ends at the next frame with `_VideoAbortedError`, its temporary removed.
    """
    import av

    height, width = frames[0].shape[:2]

    def write(tmp: Path) -> None:
        container = av.open(str(tmp), mode="w", format="mp4")
        try:
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for frame in frames:
                if stop is not None and stop.is_set():
                    raise _VideoAbortedError(str(path))
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())  # flush the encoder
        except BaseException:
            with contextlib.suppress(Exception):
                container.close()
            raise
        container.close()

    return atomic_write(path, write)


class EpisodeVideos:
    """Frames of the first `max_episodes` episodes, each written to mp4 by a background thread when it ends.

    `render(slots)` returns the RGB frames of those env slots of `env` (whose `render_fps` sets the videos'
    rate). The methods that take `slot_episode` read it as the episode each env slot runs (-1: idle).
    """

    def __init__(
        self,
        env: VectorEnv,
        videos_dir: Path | str | None,
        max_episodes: int,
        render: Callable[[list[int]], list[np.ndarray]],
    ):
        if max_episodes > 0 and videos_dir is None:
            raise ValueError("max_episodes_rendered > 0 needs a videos_dir")
        self.max_episodes, self.render = max_episodes, render
        self.dir = Path(videos_dir) if videos_dir is not None else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.fps = int(env.metadata.get("render_fps") or 10)
        self.frames: dict[int, list[np.ndarray]] = {}  # episode -> frames so far
        self.writer = ThreadPoolExecutor(max_workers=1) if max_episodes > 0 else None
        self.jobs: list[Future] = []
        self.stop = threading.Event()  # set by `abort`: the write under way ends at its next frame

    def start(self, slot_episode: np.ndarray, slots: np.ndarray) -> None:
        """Begin recording the episodes just started in `slots` that are among the first `max_episodes`."""
        for slot in slots:
            if 0 <= slot_episode[slot] < self.max_episodes:
                self.frames[int(slot_episode[slot])] = []
        self.capture(slot_episode, slots)

    def capture(self, slot_episode: np.ndarray, slots: np.ndarray) -> None:
        """Add the current frame of each recorded episode running in `slots`."""
        recording = [s for s in slots if slot_episode[s] in self.frames]
        if recording:
            for slot, image in zip(recording, self.render(recording)):
                self.frames[int(slot_episode[slot])].append(np.asarray(image))

    def finish(self, finished: np.ndarray) -> None:
        """Write the videos of the `finished` episodes that were recorded."""
        for episode in finished.tolist():
            if episode in self.frames:
                path = self.dir / f"eval_episode_{episode}.mp4"
                frames = self.frames.pop(episode)
                self.jobs.append(self.writer.submit(_write_video, path, frames, self.fps, self.stop))

    def close(self) -> tuple[list[str], OSError | None]:
        """Wait for the writes; return the paths of the videos written, in the order the episodes ended, and
        the error of the first write that a full disk stopped (None if none was): the evaluation's figures
        are still worth writing then. Any other failure is raised."""
        paths, full = [], None
        try:
            for job in self.jobs:
                try:
                    paths.append(str(job.result()))
                except OSError as e:
                    if no_space_error(e) is None:
                        raise
                    full = full or no_space_error(e)
        except BaseException:  # Ctrl-C while waiting for the writes
            self.abort()
            raise
        if self.writer is not None:
            self.writer.shutdown()
        return paths, full

    def abort(self) -> None:
        """Drop the writes not begun and end the one under way at its next frame (its temporary removed), so
        that an evaluation that ends early leaves no half-written video and no thread writing on at exit (a
        second Ctrl-C would interrupt the interpreter's wait for it, with a traceback)."""
        self.stop.set()
        if self.writer is not None:
            self.writer.shutdown(wait=True, cancel_futures=True)
