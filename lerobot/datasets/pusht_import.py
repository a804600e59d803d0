"""Find, fetch, check and convert Diffusion Policy's PushT demonstrations into the project's format.

Source resolution (first match wins; see `find_pusht_source`):

1. `dataset.root` in the config, if set: a directory holding `pusht_cchi_v7_replay.zarr` or `pusht.zip`
   (or the `.zarr` directory itself). Set but empty is an error, never a silent download.
2. `$LEROBOT_DATA_ROOT`, if set: the same.
3. The cache, `<cache>/pusht/` with `<cache>` = `dataset.cache_dir`, else `$XDG_CACHE_HOME/lerobot`, else
   `~/.cache/lerobot`: an unpacked zarr, a `pusht.zip` placed there, an earlier conversion, or else a download
   of `PUSHT_URL` (progress bar, zip CRC check, array check) into that directory.

The converted dataset goes to `<cache>/pusht/v1/` (see `lerobot.datasets.format`). It records a fingerprint of
the source (episode boundaries, states and actions); a later call with the same source reuses it, a different
source replaces it. Every write goes to a temporary sibling directory renamed into place at the end, so an
interrupted run leaves no directory that looks like a dataset; leftovers of dead processes are removed.
A conversion whose files were damaged or changed afterwards (truncated statistics, NaN written into an array)
is converted again when the source is at hand. Free space is checked before writing, and a disk that fills
up anyway ends in one `DatasetError` (not a SIGBUS), with the temporary directory removed.

Values are checked against gym-pusht's bounds (`pusht_rules`: positions within the 512 px workspace, angle
in [0, 2 pi], pixels 0-255): a bit flip in a compressed chunk can decode to a plausible-looking -1.2e32
that would otherwise poison the statistics.

Frame semantics of the derived features, for the frame `t` of an episode with frames `0..T-1`:

- `observation.environment_state[t]`: keypoints of the block pose recorded at `t` (what the env shows).
- `next.reward[t]`, `next.success[t]`: the env's coverage rule on the pose at `t + 1`, i.e. the state reached
  after `action[t]`, which is what `env.step(action[t])` returns. The last frame has no recorded successor
  and uses its own pose (an approximation: at episode ends the block still moves ~2 px per step).
  The human demonstrations stop short of the env's success rule: their best coverage is 0.77-0.90 per
  episode (median 0.85), so `next.success` is False on every frame of the original data. This was checked
  against the recorded images: rendering the env at the recorded pose reproduces them (mean abs. pixel
  difference ~0.1), so the pose convention and the goal are the env's.
- `next.done[t]`: True only on the last frame of each episode.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from lerobot.config import DatasetConfig
from lerobot.constants import (
    ACTION,
    DATA_ROOT_ENV,
    NEXT_DONE,
    NEXT_REWARD,
    NEXT_SUCCESS,
    OBS_ENV_STATE,
    OBS_IMAGE,
    OBS_STATE,
)
from lerobot.datasets.cache import default_cache_dir
from lerobot.datasets.conversion import remove_stale_temps, write_conversion
from lerobot.datasets.format import (
    EPISODE_INDEX,
    FORMAT_VERSION,
    FRAME_INDEX,
    META_FILE,
    TIMESTAMP,
    combine_episode_stats,
    feature_file,
    open_preallocated_memmap,
    read_meta,
    sufficient_stats,
    uint8_channel_stats,
    write_meta,
    write_stats,
)
from lerobot.datasets.pusht_rules import (
    ACTION_HIGH,
    ACTION_LOW,
    STATE_HIGH,
    STATE_LOW,
    block_keypoints,
    coverage_reward,
)
from lerobot.datasets.pusht_zarr import open_pusht_zarr, read_array
from lerobot.errors import DatasetError, DatasetNotFoundError

log = logging.getLogger(__name__)

PUSHT_URL = "https://diffusion-policy.cs.columbia.edu/data/training/pusht.zip"
ZARR_NAME = "pusht_cchi_v7_replay.zarr"
ZIP_NAME = "pusht.zip"
PUSHT_FPS = 10
CONVERTED_NAME = f"v{FORMAT_VERSION}"
# Bumped whenever the conversion's output changes without a format change (e.g. a fixed derivation), so
# existing caches are rebuilt: it is part of the source fingerprint.
# Revision 3 added the bounds checks: conversions made before them are checked (and rebuilt) once.
CONVERTER_REVISION = 3

# Bytes per frame of the arrays written besides the image: float32 state (2), keypoints (16), action (2),
# reward; bool success, done; int64 episode and frame index; float32 timestamp.
_LOW_DIM_BYTES_PER_FRAME = 4 * (2 + 16 + 2 + 1) + 2 + 2 * 8 + 4
# Images are converted this many frames at a time: large enough to amortize zarr's per-call overhead,
# small enough (~180 MB of float32 at 96x96) to stay out of memory trouble.
_IMAGE_BLOCK = 1600


def pusht_cache_dir(dataset_cfg: DatasetConfig | None = None) -> Path:
    """Directory for PushT's download, unpacked source and conversion: `<cache>/pusht`."""
    return default_cache_dir(dataset_cfg) / "pusht"


# ----------------------------------------------------------------------------------------------- sources


def _zarr_in(directory: Path) -> Path | None:
    """The PushT zarr inside `directory` (or `directory` itself if it is one), else None."""
    if directory.suffix == ".zarr" and directory.is_dir():
        return directory
    candidate = directory / ZARR_NAME
    return candidate if candidate.is_dir() else None


def find_pusht_source(dataset_cfg: DatasetConfig, download: bool = True, url: str = PUSHT_URL) -> Path | None:
    """Locate (unpacking or downloading if needed) the PushT zarr; return its path.

    Returns None only when no source exists but a converted dataset is already in the cache (and no
    explicit root is configured), since the conversion is then all that is needed.

    Raises:
        DatasetNotFoundError: a configured root holds no data, or nothing is cached and the download failed.
    """
    cache = pusht_cache_dir(dataset_cfg)
    explicit = [("dataset.root", dataset_cfg.root), (f"${DATA_ROOT_ENV}", os.environ.get(DATA_ROOT_ENV))]
    for setting, value in explicit:
        if not value:
            continue
        directory = Path(value).expanduser()
        if (found := _zarr_in(directory)) is not None:
            return found
        if (directory / ZIP_NAME).is_file():
            return extract_pusht_zip(directory / ZIP_NAME, cache)
        raise DatasetNotFoundError(
            f"{setting}={value}: no {ZARR_NAME} or {ZIP_NAME} in {directory}; point {setting} at the "
            f"directory holding one (download: {PUSHT_URL})"
        )
    if (found := _zarr_in(cache)) is not None:
        return found
    if (cache / ZIP_NAME).is_file():
        return extract_pusht_zip(cache / ZIP_NAME, cache)
    if (cache / CONVERTED_NAME / META_FILE).is_file():
        return None
    if not download:
        raise DatasetNotFoundError(_not_found_message(cache, "downloads are disabled"))
    zip_path = download_pusht(cache, url)
    return extract_pusht_zip(zip_path, cache)


def _not_found_message(cache: Path, reason: str) -> str:
    return (
        f"PushT demonstrations not found and not downloadable ({reason}). Either put {ZIP_NAME} or "
        f"{ZARR_NAME} (from {PUSHT_URL}) in {cache}, or set dataset.root or ${DATA_ROOT_ENV} to a directory "
        f"holding {ZARR_NAME}"
    )


def download_pusht(cache: Path, url: str = PUSHT_URL, timeout_s: float = 30.0) -> Path:
    """Download the PushT archive into `cache/pusht.zip` with a progress bar; check it; return its path.

    The bytes go to a `.part` file renamed only after the zip's CRCs check out, so an interrupted
    download is never mistaken for the archive.
    """
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / ZIP_NAME
    remove_stale_temps(cache, ZIP_NAME)
    part = cache / f".{ZIP_NAME}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {url}") as bar:
                while block := response.read(1 << 20):
                    out.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        raise DatasetNotFoundError(_not_found_message(cache, f"download of {url} failed: {e}")) from None
    try:
        check_zip(part)
    except DatasetError:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, final)
    return final


def check_zip(zip_path: Path) -> None:
    """Raise `DatasetError` unless `zip_path` is a complete zip archive containing the PushT zarr."""
    try:
        with zipfile.ZipFile(zip_path) as zf:
            bad = zf.testzip()
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DatasetError(f"{zip_path}: not a readable zip archive ({e}); delete it and retry") from None
    if bad is not None:
        raise DatasetError(f"{zip_path}: corrupt member {bad!r} (CRC mismatch); delete it and retry")
    if not any(f"{ZARR_NAME}/" in name for name in names):
        raise DatasetError(f"{zip_path}: archive holds no {ZARR_NAME}")


def extract_pusht_zip(zip_path: Path, cache: Path) -> Path:
    """Unpack the zarr from `zip_path` into `cache/pusht_cchi_v7_replay.zarr` (atomically); return it."""
    target = cache / ZARR_NAME
    if target.is_dir():
        return target
    check_zip(zip_path)
    cache.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(cache, ZARR_NAME)
    tmp = cache / f".{ZARR_NAME}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(tmp)
        found = sorted(p for p in tmp.rglob(ZARR_NAME) if p.is_dir())
        if not found:
            raise DatasetError(f"{zip_path}: archive holds no {ZARR_NAME} directory")
        open_pusht_zarr(found[0])
        try:
            os.rename(found[0], target)
        except OSError:
            # Another process unpacked it first; theirs is as good as ours.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def source_fingerprint(arrays: dict[str, Any], path: Path) -> str:
    """sha256 of format version, converter revision, episode boundaries, states and actions.

    Images are not hashed (~3 GB to read); the arrays hashed identify the demonstrations.
    """
    digest = hashlib.sha256(f"pusht-v{FORMAT_VERSION}-r{CONVERTER_REVISION}".encode())
    for name in ("meta/episode_ends", "data/state", "data/action"):
        data = read_array(path, name, arrays[name])
        digest.update(f"{name}{data.shape}{data.dtype}".encode())
        digest.update(np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------- conversion


def prepare_pusht(dataset_cfg: DatasetConfig, download: bool = True, url: str = PUSHT_URL) -> Path:
    """Return the converted PushT dataset directory, finding/downloading and converting the source if needed.

    Fast when the conversion is already there (reads the small arrays to check the fingerprint).
    """
    source = find_pusht_source(dataset_cfg, download=download, url=url)
    out_dir = pusht_cache_dir(dataset_cfg) / CONVERTED_NAME
    if source is None:
        read_meta(out_dir)
        return out_dir
    return convert_pusht_zarr(source, out_dir)


def convert_pusht_zarr(zarr_path: Path, out_dir: Path, force: bool = False) -> Path:
    """Convert the PushT zarr at `zarr_path` into the project's format at `out_dir`; return `out_dir`.

    Idempotent: if `out_dir` already holds a conversion of the same source (same fingerprint), nothing is
    done unless `force`. Atomic: everything is written to `.{name}.tmp-<pid>-<id>` beside `out_dir` and
    renamed into place; an existing conversion of another source is swapped out the same way.

    Raises:
        DatasetError: the source is malformed (missing arrays, mismatched lengths, corrupt chunks, ...).
    """
    zarr_path, out_dir = Path(zarr_path), Path(out_dir)
    arrays = open_pusht_zarr(zarr_path)
    fingerprint = source_fingerprint(arrays, zarr_path)
    t0 = time.perf_counter()
    written = write_conversion(
        out_dir, fingerprint, converted_bytes(arrays),
        lambda tmp: _write_converted(arrays, zarr_path, tmp, fingerprint), force,
    )  # fmt: skip
    if written:
        log.info("converted %s -> %s in %.1f s", zarr_path, out_dir, time.perf_counter() - t0)
    return out_dir


def converted_bytes(arrays: dict[str, Any]) -> int:
    """Bytes the conversion of the PushT zarr `arrays` writes (uint8 images plus the per-frame arrays)."""
    num_frames, height, width, channels = arrays["data/img"].shape
    return num_frames * (height * width * channels + _LOW_DIM_BYTES_PER_FRAME)


def _write_converted(arrays: dict[str, Any], src: Path, out: Path, fingerprint: str) -> None:
    """Write every feature array, the statistics and (last) `meta.json` into the directory `out`."""
    ends = read_array(src, "meta/episode_ends", arrays["meta/episode_ends"]).astype(np.int64)
    state = read_array(src, "data/state", arrays["data/state"])
    action = read_array(src, "data/action", arrays["data/action"])
    num_frames, num_episodes = int(ends[-1]), len(ends)
    starts = np.concatenate([[0], ends[:-1]])
    lengths = ends - starts
    episode_index = np.repeat(np.arange(num_episodes), lengths)
    frame_index = np.arange(num_frames) - starts[episode_index]
    _check_bounds(src, "data/state", state, STATE_LOW, STATE_HIGH, ends)
    _check_bounds(src, "data/action", action, ACTION_LOW, ACTION_HIGH, ends)
    state = state.astype(np.float64)

    # The state after action t is the recorded state t + 1 of the same episode; the last frame of an
    # episode has no successor and keeps its own pose.
    next_frame = np.minimum(np.arange(num_frames) + 1, ends[episode_index] - 1)
    reward, success = coverage_reward(state[next_frame, 2:5])
    done = np.zeros(num_frames, dtype=bool)
    done[ends - 1] = True

    low_dim = {
        OBS_STATE: state[:, :2].astype(np.float32),
        OBS_ENV_STATE: block_keypoints(state[:, 2:5]).astype(np.float32),
        ACTION: action.astype(np.float32),
        NEXT_REWARD: reward.astype(np.float32),
        NEXT_SUCCESS: success,
        NEXT_DONE: done,
    }
    bookkeeping = {
        EPISODE_INDEX: episode_index.astype(np.int64),
        FRAME_INDEX: frame_index.astype(np.int64),
        TIMESTAMP: (frame_index / PUSHT_FPS).astype(np.float32),
    }
    for key, values in {**low_dim, **bookkeeping}.items():
        np.save(feature_file(out, key), values)

    image_shape, image_stats = _write_images(arrays["data/img"], src, out, starts, ends)
    per_episode = {
        key: [sufficient_stats(values[s:e]) for s, e in zip(starts, ends)] for key, values in low_dim.items()
    }
    per_episode[OBS_IMAGE] = image_stats
    write_stats(out, *combine_episode_stats(per_episode, num_episodes))

    features = {OBS_IMAGE: {"shape": list(image_shape), "dtype": "uint8", "kind": "visual"}}
    kinds = {OBS_STATE: "state", OBS_ENV_STATE: "env_state", ACTION: "action"}
    for key, values in {**low_dim, **bookkeeping}.items():
        features[key] = {
            "shape": list(values.shape[1:]),
            "dtype": str(values.dtype),
            "kind": kinds.get(key, "other"),
        }
    write_meta(
        out,
        "pusht",
        PUSHT_FPS,
        ends,
        features,
        source={"path": str(src), "fingerprint": fingerprint, "url": PUSHT_URL},
        notes={
            OBS_ENV_STATE: "gym-pusht keypoints of the block pose recorded at this frame",
            NEXT_REWARD: "coverage reward of the next frame's block pose (own pose on an episode's last frame)",
            NEXT_SUCCESS: "coverage > 0.95 for the same pose as next.reward",
            NEXT_DONE: "True on the last frame of each episode",
        },
    )


def _check_bounds(
    src: Path, name: str, values: np.ndarray, low: np.ndarray, high: np.ndarray, ends: np.ndarray
) -> None:
    """Raise `DatasetError` naming the first value of `values` (N, D) outside [low, high] (D,) or NaN.

    The bounds are cast to the array's dtype first: a float32 angle of 2 pi rounds up past float64's 2 pi.
    """
    low, high = low.astype(values.dtype), high.astype(values.dtype)
    inside = (values >= low) & (values <= high)
    if inside.all():
        return
    row, col = np.argwhere(~inside)[0]
    raise DatasetError(
        f"{src}/{name}: {_where(row, ends)} column {col} is {values[row, col]:.6g}, outside gym-pusht's "
        f"bounds [{low[col]:.6g}, {high[col]:.6g}]; {_corrupt_source_fix(src)}"
    )


def _where(row: int, ends: np.ndarray) -> str:
    """'episode e frame f (row r)' for global frame `row` given the exclusive episode `ends`."""
    episode = int(np.searchsorted(ends, row, side="right"))
    start = int(ends[episode - 1]) if episode else 0
    return f"episode {episode} frame {row - start} (row {row})"


def _corrupt_source_fix(src: Path) -> str:
    return (
        f"the source is damaged (e.g. a bit flip in a compressed chunk): replace {src} with an intact copy "
        f"(delete it to download {PUSHT_URL} again, or point dataset.root at another copy)"
    )


def _write_images(
    img: Any, src: Path, out: Path, starts: np.ndarray, ends: np.ndarray
) -> tuple[tuple[int, ...], list[dict[str, np.ndarray]]]:
    """Stream float 0-255 (N, H, W, 3) images into a uint8 (N, 3, H, W) `.npy`; return shape and episode stats.

    Channel-first uint8 is what a batch needs after a single float conversion, with no transpose per item.
    """
    num_frames, height, width, channels = img.shape
    dest = open_preallocated_memmap(
        feature_file(out, OBS_IMAGE), dtype=np.uint8, shape=(num_frames, channels, height, width)
    )
    block = max(img.chunks[0], _IMAGE_BLOCK // img.chunks[0] * img.chunks[0])
    for lo in tqdm(range(0, num_frames, block), desc="converting images", unit="block", leave=False):
        hi = min(lo + block, num_frames)
        frames = read_array(src, "data/img", img, slice(lo, hi))
        inside = (frames >= 0.0) & (frames <= 255.0)
        if not inside.all():
            row = lo + int(np.argwhere(~inside)[0, 0])
            raise DatasetError(
                f"{src}/data/img: {_where(row, ends)} holds pixel values outside 0-255 (or NaN); "
                f"{_corrupt_source_fix(src)}"
            )
        dest[lo:hi] = np.rint(frames).astype(np.uint8).transpose(0, 3, 1, 2)
    dest.flush()
    stats = [uint8_channel_stats(dest[s:e]) for s, e in zip(starts, ends)]
    del dest
    return (channels, height, width), stats
