"""Damaged data, reproduced with real corrupted files: bit-flipped source chunks, converted arrays changed after
conversion, truncated statistics, and a disk that fills up during conversion (a real, small tmpfs)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import load_file, save_file
from test_dataset import ZARR, write_fake_zarr

from lerobot.datasets import EpisodeDataset, pusht_import
from lerobot.datasets.format import EPISODE_STATS_FILE, feature_file
from lerobot.datasets.pusht_import import convert_pusht_zarr
from lerobot.datasets.pusht_rules import ACTION_HIGH, ACTION_LOW
from lerobot.errors import DatasetError

REPO_ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [3, 5, 4, 6]


@pytest.fixture
def converted(tmp_path) -> tuple[Path, Path]:
    """(zarr path, converted dir) of a fresh fake PushT source."""
    src = tmp_path / "data" / ZARR
    write_fake_zarr(src, LENGTHS)
    return src, convert_pusht_zarr(src, tmp_path / "cache" / "pusht" / "v1")


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --------------------------------------------------------------------------------------- damaged source


def _flip_until_out_of_bounds(src: Path) -> tuple[int, int, float]:
    """Flip single bits of the compressed `data/action` chunk until it decodes to out-of-bounds values.

    Returns (row, column, value) of the first such value, the file left with that flip (a real corrupt chunk:
    it decompresses without error, as a bit flip in a compressed literal does).
    """
    chunk = src / "data" / "action" / "0.0"
    raw = chunk.read_bytes()
    for byte in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[byte] ^= 1 << bit
            chunk.write_bytes(bytes(flipped))
            try:
                action = zarr.open_group(str(src), mode="r")["data/action"][:]
            except Exception:  # the codec noticed: that flip is already reported as a corrupt chunk
                continue
            outside = ~((action >= ACTION_LOW) & (action <= ACTION_HIGH))
            if outside.any():
                row, col = np.argwhere(outside)[0]
                return int(row), int(col), float(action[row, col])
    raise AssertionError("no single bit flip of the chunk decodes to out-of-bounds actions")


def test_bit_flipped_source_chunk_is_refused_with_its_frame(tmp_path):
    src = tmp_path / "data" / ZARR
    write_fake_zarr(src, LENGTHS)
    row, col, value = _flip_until_out_of_bounds(src)
    ends = np.cumsum(LENGTHS)
    episode = int(np.searchsorted(ends, row, side="right"))
    frame = row - (int(ends[episode - 1]) if episode else 0)
    out = tmp_path / "cache" / "pusht" / "v1"
    with pytest.raises(DatasetError) as info:
        convert_pusht_zarr(src, out)
    message = str(info.value)
    assert "\n" not in message
    assert f"data/action: episode {episode} frame {frame} (row {row}) column {col} is {value:.6g}" in message
    assert "outside gym-pusht's bounds [0, 512]" in message and "replace" in message
    assert not out.exists() and _leftovers(out.parent) == []


def test_out_of_range_pixels_name_their_frame(tmp_path):
    src = tmp_path / "data" / ZARR
    write_fake_zarr(src, LENGTHS)
    img = zarr.open_group(str(src), mode="r+")["data/img"]
    img[9, 2, 3, 1] = -1.2e32  # row 9 = episode 2, frame 1
    with pytest.raises(
        DatasetError, match=r"data/img: episode 2 frame 1 \(row 9\) holds pixel values outside"
    ):
        convert_pusht_zarr(src, tmp_path / "v1")


# ------------------------------------------------------------------------ converted data damaged later


@pytest.mark.parametrize("planted", [np.nan, 1e30, -np.inf])
def test_value_planted_in_converted_array_is_refused_when_opened(converted, planted, caplog):
    src, root = converted
    action = np.load(feature_file(root, "action"), mmap_mode="r+")
    action[9, 1] = planted  # row 9 = episode 2, frame 1
    action.flush()
    del action
    with pytest.raises(DatasetError) as info:
        EpisodeDataset(root)
    message = str(info.value)
    assert "\n" not in message
    assert f"action.npy: episode 2 frame 1 (row 9) holds {planted:.6g}, outside the range" in message
    assert f"delete {root} to convert again" in message
    # With the source at hand, the importer rebuilds the damaged conversion instead.
    with caplog.at_level(logging.WARNING, logger=pusht_import.__name__):
        convert_pusht_zarr(src, root)
    assert "converting again" in caplog.text
    assert EpisodeDataset(root).__getitems__([9])["action"].isfinite().all()


def test_extremes_taken_before_a_float32_cast_are_no_false_alarm(converted):
    """An importer may take min/max of float64 source values and store the array as float32."""
    _, root = converted
    ends = np.cumsum(LENGTHS)
    source = np.random.default_rng(0).uniform(0, 512, (ends[-1], 2))
    stored = source.astype(np.float32)
    np.save(feature_file(root, "action"), stored)
    stats = load_file(root / EPISODE_STATS_FILE)
    bounds = np.split(source, ends[:-1])
    stats["action/min"] = np.stack([b.min(0) for b in bounds])
    stats["action/max"] = np.stack([b.max(0) for b in bounds])
    save_file(stats, root / EPISODE_STATS_FILE)
    episode = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    rounded_out = (stored < stats["action/min"][episode]) | (stored > stats["action/max"][episode])
    assert rounded_out.any()  # compared in float64, some stored values would look out of range
    EpisodeDataset(root)


def test_truncated_statistics_are_one_line_and_rebuilt(converted, caplog):
    src, root = converted
    stats = root / EPISODE_STATS_FILE
    stats.write_bytes(stats.read_bytes()[: stats.stat().st_size // 2])
    with pytest.raises(DatasetError) as info:
        EpisodeDataset(root)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{stats}: unreadable statistics (SafetensorError")
    assert message.endswith(f"delete {root} to convert again")
    with caplog.at_level(logging.WARNING, logger=pusht_import.__name__):
        convert_pusht_zarr(src, root)
    assert "converting again" in caplog.text
    assert EpisodeDataset(root).stats["action"]["mean"].shape == (2,)


# ------------------------------------------------------------------------------------------- full disk


def test_too_little_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    """Preflight check with a mocked `shutil.disk_usage` (the real full disk is the tmpfs test below)."""
    src = tmp_path / "data" / ZARR
    write_fake_zarr(src, LENGTHS)
    out = tmp_path / "cache" / "v1"
    needed = pusht_import.converted_bytes(pusht_import.open_pusht_zarr(src))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=needed - 1))
    with pytest.raises(DatasetError, match=rf"{out.parent}: not enough disk space .* needs [0-9.]+ MB there"):
        convert_pusht_zarr(src, out)
    assert list(out.parent.iterdir()) == []


# Converts into a tmpfs of 128 KB mounted in a private user + mount namespace (no root needed), once per mode
# given, reporting each failure as the CLI does (one "error:" line) and what the tmpfs holds afterwards.
# preflight: as shipped; preallocated: the preflight check fooled, so the writes themselves meet the full
# disk; sparse: in addition the image map made the old way (sparse, written page by page).
_CONVERT_ON_SMALL_DISK = """
import shutil, sys
from pathlib import Path
import numpy as np
from lerobot.datasets import pusht_import
from lerobot.datasets.pusht_import import convert_pusht_zarr
from lerobot.errors import DatasetError
src, disk = Path(sys.argv[1]), Path(sys.argv[2])
real_disk_usage = shutil.disk_usage
for mode in sys.argv[3:]:
    if mode != "preflight":
        shutil.disk_usage = lambda p: real_disk_usage(p)._replace(free=1 << 40)
    if mode == "sparse":
        pusht_import.open_preallocated_memmap = lambda path, dtype, shape: np.lib.format.open_memmap(
            path, mode="w+", dtype=dtype, shape=shape)
    try:
        convert_pusht_zarr(src, disk / "v1")
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        print("left:", sorted(p.name for p in disk.iterdir()))
sys.exit(2)
"""


def _convert_on_small_disk(tmp_path: Path, *modes: str) -> subprocess.CompletedProcess:
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = f"mount -t tmpfs -o size=128k tmpfs {disk}"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "sh", "-c", mount]).returncode:
        pytest.skip("needs unprivileged user namespaces (unshare -rm) to mount a small tmpfs")
    src = tmp_path / "data" / ZARR
    # 64x64 images: 221 KB of uint8, more than the 128 KB disk; the other arrays fit.
    write_fake_zarr(src, LENGTHS, image_size=64)
    script = textwrap.dedent(_CONVERT_ON_SMALL_DISK)
    command = f"{mount} && exec {sys.executable} -c '{script}' {src} {disk} {' '.join(modes)}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )


def test_full_disk_during_conversion_is_one_line_on_a_real_small_filesystem(tmp_path):
    run = _convert_on_small_disk(tmp_path, "preflight", "preallocated")
    disk = tmp_path / "disk"
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    problems = ["not enough disk space", "ran out of space (No space left on device)"]
    assert len(errors) == 2, run.stderr[-2000:]
    for error, problem in zip(errors, problems):
        assert error.startswith(
            f"error: {disk}: {problem} while converting the dataset: it needs 0.2 MB there"
        )
        assert error.endswith("set dataset.cache_dir to a disk with room")
    assert run.stdout.split("\n")[:2] == ["left: []", "left: []"]


def test_sparse_memory_map_on_a_full_disk_dies_of_sigbus(tmp_path):
    """The fault the preallocation prevents, reproduced on the same disk: the kernel kills the process."""
    run = _convert_on_small_disk(tmp_path, "sparse")
    assert run.returncode in (-7, 135), (run.returncode, run.stderr[-2000:])
