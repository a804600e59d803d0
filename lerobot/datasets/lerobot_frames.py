"""Decode a LeRobotDataset's camera frames into (N, 3, H, W) uint8 arrays: PNG images stored in the parquet
rows (`decode_images_into`) and mp4 videos (`decode_video_into`), optionally resized as they are stored
(`resizing`).

Both decoders store the pixels as decoded (no conversion), as LeRobot's loader returns them (scaled to [0, 1]
there); video frames are matched to the timestamps rows ask for within `TOLERANCE_S`, as LeRobot's loader
does. Everything malformed is one `DatasetError` line naming the file and the problem.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa

from lerobot.datasets.lerobot_format import TOLERANCE_S
from lerobot.errors import DatasetError


def decode_images_into(
    table: pa.Table, key: str, out: np.ndarray, rows: np.ndarray, path: Path, episode: int
) -> None:
    """Decode the images of column `key` of one episode's rows `table` (from parquet file `path`) into
    `out[rows]`.

    Args:
        table: the episode's rows, in frame order; column `key` holds LeRobot's image structs `{bytes, path}`
            (PNG bytes).
        key: the camera feature.
        out: (N, 3, H, W) uint8 destination (an `np.memmap` works).
        rows: (len(table),) destination index in `out` of each row.
        path: the parquet file, and `episode` the episode's index: for the error messages.

    The pixels are the decoded RGB values as they are (no conversion), as LeRobot's loader returns them
    (scaled to [0, 1] there).

    Raises:
        DatasetError: the column is not an image struct, a row has no embedded bytes, or an image does not
            decode, is not RGB or has another size than info.json says.
    """
    from PIL import Image, UnidentifiedImageError  # imported here: only importing a LeRobotDataset decodes

    column = table.column(key).combine_chunks()
    if not pa.types.is_struct(column.type) or column.type.get_field_index("bytes") < 0:
        raise DatasetError(
            f"{path}: column {key!r} is {column.type}, not an image struct {{bytes, path}} as info.json's "
            "dtype 'image' says"
        )
    blobs = column.field("bytes")
    height, width = out.shape[2:]
    for frame, row in enumerate(rows):
        where = f"{path}: episode {episode} frame {frame}: {key!r}"
        blob = blobs[frame].as_py() if column[frame].is_valid else None
        if blob is None:
            stored = column[frame]["path"].as_py() if column[frame].is_valid else None
            raise DatasetError(
                f"{where} holds no image bytes (path {stored!r}); only images embedded in the parquet files "
                "are read (LeRobot embeds them when it saves an episode)"
            )
        try:
            with Image.open(io.BytesIO(blob)) as image:
                image.load()
                mode, size = image.mode, image.size
                pixels = np.asarray(image) if mode == "RGB" and size == (width, height) else None
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise DatasetError(f"{where} does not decode as an image ({e})") from None
        if pixels is None:
            raise DatasetError(
                f"{where} is a {size[1]}x{size[0]} {mode} image, info.json says {height}x{width} RGB"
            )
        out[row] = pixels.transpose(2, 0, 1)


def decode_video_into(
    path: Path, timestamps: np.ndarray, out: np.ndarray, rows: np.ndarray, tolerance_s: float = TOLERANCE_S
) -> None:
    """Decode the mp4 at `path` front to back once and store the frame of each requested timestamp.

    Args:
        path: the video file.
        timestamps: (n,) seconds into the video, e.g. `from_timestamp + timestamp` of n parquet rows.
        out: (N, 3, H, W) uint8 destination (an `np.memmap` works).
        rows: (n,) destination index in `out` of each timestamp.
        tolerance_s: a frame is the one shown at `t` if its presentation time lies within this of `t`.

    Raises:
        DatasetError: the file is missing or does not decode, frames have another size, or no frame lies
            within `tolerance_s` of a requested timestamp (named, with the nearest frames around it).
    """
    import av  # imported here: only importing a LeRobotDataset decodes video
    from av.video.reformatter import VideoReformatter

    if not path.is_file():
        raise DatasetError(
            f"{path}: missing video; the LeRobotDataset is incomplete (copy or download it again)"
        )
    order = np.argsort(timestamps, kind="stable")
    wanted, targets = np.asarray(timestamps, dtype=np.float64)[order], np.asarray(rows)[order]
    height, width = out.shape[2:]
    j, previous = 0, None
    # One reformatter for the whole file keeps its conversion context instead of building one per frame
    # (`to_ndarray(format=)`), with identical pixels.
    to_rgb = VideoReformatter()
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = float(frame.pts * stream.time_base)
                if j < len(wanted) and wanted[j] < t - tolerance_s:
                    raise DatasetError(_missing_frame(path, wanted[j], previous, t, tolerance_s))
                if j < len(wanted) and abs(wanted[j] - t) <= tolerance_s:
                    if (frame.height, frame.width) != (height, width):
                        raise DatasetError(
                            f"{path}: frames are {frame.height}x{frame.width}, info.json says {height}x{width}"
                        )
                    image = to_rgb.reformat(frame, format="rgb24").to_ndarray()  # (H, W, 3)
                    while j < len(wanted) and abs(wanted[j] - t) <= tolerance_s:
                        out[targets[j]] = image.transpose(2, 0, 1)
                        j += 1
                previous = t
                if j == len(wanted):
                    break
    except (av.error.FFmpegError, IndexError) as e:
        raise DatasetError(f"{path}: video does not decode ({type(e).__name__}: {e})") from None
    if j < len(wanted):
        raise DatasetError(_missing_frame(path, wanted[j], previous, None, tolerance_s))


def _missing_frame(
    path: Path, t: float, before: float | None, after: float | None, tolerance_s: float
) -> str:
    around = ", ".join(f"{x:.4f} s" for x in (before, after) if x is not None) or "none"
    return (
        f"{path}: no frame within {tolerance_s:g} s of timestamp {t:.4f} s (nearest frames: {around}); "
        "the parquet timestamps and the video disagree (re-encode the video or fix meta/episodes)"
    )


class ResizedFrames:
    """Where a decoder stores frames of the recorded size: each is resized into `dest` (N, 3, h, w) uint8.

    A decoder sees `shape` (N, 3, H, W) of the recorded frames and assigns `frames[row] = image` (3, H, W);
    the box filter makes each stored pixel the mean of the source pixels it covers.
    """

    def __init__(self, dest: np.ndarray, recorded: tuple[int, int]):
        self.dest = dest
        self.shape = (dest.shape[0], dest.shape[1], *recorded)

    def __setitem__(self, row: int, image: np.ndarray) -> None:
        from PIL import Image  # imported here: only importing a LeRobotDataset decodes

        height, width = self.dest.shape[2:]
        resized = Image.fromarray(np.ascontiguousarray(image.transpose(1, 2, 0))).resize(
            (width, height), Image.Resampling.BOX
        )
        self.dest[row] = np.asarray(resized).transpose(2, 0, 1)


def resizing(dest: np.ndarray, recorded: tuple[int, int]) -> np.ndarray | ResizedFrames:
    """`dest` itself when its frames have the recorded size, else a `ResizedFrames` writing into it."""
    return dest if tuple(dest.shape[2:]) == tuple(recorded) else ResizedFrames(dest, recorded)
