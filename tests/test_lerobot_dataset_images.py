"""LeRobotDatasets whose camera frames are images in the parquet files (`dtype: image`, PNG bytes).

The fixture `lerobot_dataset_images` was recorded by LeRobot 0.6.1 itself (scripts/make_lerobot_fixtures.py
--kind dataset_images: `LeRobotDataset.create(..., use_videos=False)`, 3 episodes of 4, 6 and 5 frames of a
3x16x16 camera, a 2-d state and a 2-d action); its `reference.safetensors` is what LeRobot's own
`LeRobotDataset` returns for every frame.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from safetensors.numpy import load_file

from lerobot.config import DatasetConfig, EnvConfig, FeatureConfig
from lerobot.datasets import EpisodeDataset, make_dataset
from lerobot.datasets.lerobot_format import INFO_PATH, LEGACY_EPISODES_STATS_PATH, STATS_PATH
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.errors import DatasetError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot_dataset_images"
DATASET = FIXTURE / "dataset"
IMAGE = "observation.image"
DATA_FILE = "data/chunk-000/file-000.parquet"
LENGTHS = [4, 6, 5]


def _reference() -> dict[str, np.ndarray]:
    return load_file(FIXTURE / "reference.safetensors")


def _env() -> EnvConfig:
    return EnvConfig(
        name="images",
        fps=10,
        features={
            IMAGE: FeatureConfig(shape=[3, 16, 16], kind="visual"),
            "observation.state": FeatureConfig(shape=[2], kind="state"),
            "action": FeatureConfig(shape=[2], kind="action"),
        },
    )


def _to_v21(v3: Path, out: Path) -> Path:
    """The fixture in LeRobot's v2.1 layout: one parquet file per episode (the same rows, images included),
    jsonl metadata with per-episode min/max."""
    info = json.loads((v3 / INFO_PATH).read_text())
    table = pq.read_table(v3 / DATA_FILE)
    episode_of_row = table.column("episode_index").to_numpy()
    (out / "meta").mkdir(parents=True)
    episodes, episodes_stats = [], []
    for e, length in enumerate(LENGTHS):
        rows = np.flatnonzero(episode_of_row == e)
        part = table.slice(int(rows[0]), len(rows))
        path = out / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, path)
        episodes.append({"episode_index": e, "tasks": ["tiny"], "length": length})
        stats = {}
        for key in ("observation.state", "action"):
            values = np.asarray(part.column(key).to_pylist(), dtype=np.float64)
            stats[key] = {"min": values.min(0).tolist(), "max": values.max(0).tolist()}
        episodes_stats.append({"episode_index": e, "stats": stats})
    info.update(
        codebase_version="v2.1",
        data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        total_chunks=1,
    )
    (out / INFO_PATH).write_text(json.dumps(info))
    (out / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in episodes))
    (out / LEGACY_EPISODES_STATS_PATH).write_text("".join(json.dumps(r) + "\n" for r in episodes_stats))
    (out / "meta/tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "tiny"}) + "\n")
    return out


@pytest.mark.parametrize("layout", ["v3", "v21"])
def test_frames_are_what_lerobots_loader_returns(tmp_path, layout):
    """The uint8 (3, H, W) frames are LeRobot's [0, 1] images times 255, exactly; the vectors and indices
    are LeRobot's too."""
    source = DATASET if layout == "v3" else _to_v21(DATASET, tmp_path / "v21")
    out = convert_lerobot_dataset(source, tmp_path / "out" / "v1")
    reference = _reference()
    frames = np.load(out / f"{IMAGE}.npy")
    assert frames.dtype == np.uint8 and frames.shape == (sum(LENGTHS), 3, 16, 16)
    np.testing.assert_array_equal(frames.astype(np.float32) / np.float32(255.0), reference[IMAGE])
    for key in ("observation.state", "action", "episode_index", "frame_index"):
        np.testing.assert_array_equal(np.load(out / f"{key}.npy"), reference[key], err_msg=key)
    meta = EpisodeDataset(out).meta
    assert meta["features"][IMAGE] == {"shape": [3, 16, 16], "dtype": "uint8", "kind": "visual"}
    assert meta["episode_ends"] == np.cumsum(LENGTHS).tolist()


def test_statistics_are_those_of_the_frames(tmp_path):
    """Per-channel statistics in the [0, 1] scale, over every pixel of every frame (as for decoded videos),
    and LeRobot's own stats.json agrees."""
    out = convert_lerobot_dataset(DATASET, tmp_path / "v1")
    stats = json.loads((out / "stats.json").read_text())[IMAGE]
    # (N, 3, H, W): LeRobot's float32 images as the exact levels i / 255, in float64.
    images = np.rint(_reference()[IMAGE].astype(np.float64) * 255) / 255
    np.testing.assert_allclose(stats["mean"], images.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], images.std(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_array_equal(stats["min"], images.min(axis=(0, 2, 3)))
    np.testing.assert_array_equal(stats["max"], images.max(axis=(0, 2, 3)))
    lerobot = json.loads((DATASET / STATS_PATH).read_text())[IMAGE]
    np.testing.assert_allclose(stats["mean"], np.ravel(lerobot["mean"]), rtol=1e-6)
    np.testing.assert_allclose(stats["std"], np.ravel(lerobot["std"]), rtol=1e-4)  # LeRobot pools per episode


def test_training_batches_hold_lerobots_images(tmp_path):
    cfg = DatasetConfig(repo_id="test/images", root=str(DATASET), cache_dir=str(tmp_path / "cache"))
    dataset = make_dataset(cfg, _env(), {IMAGE: [0.0], "action": [0.0, 0.1]})
    batch = dataset.__getitems__(range(len(dataset)))
    reference = _reference()
    assert torch.equal(batch[IMAGE][:, 0], torch.from_numpy(reference[IMAGE]))
    assert torch.equal(batch["action"][:, 0], torch.from_numpy(reference["action"]))


def _rewrite_image(root: Path, row: int, blob: bytes | None, path: str | None = "frame.png") -> None:
    """Replace the image struct of one parquet row."""
    file = root / DATA_FILE
    table = pq.read_table(file)
    values = table.column(IMAGE).to_pylist()
    values[row] = None if blob is None and path is None else {"bytes": blob, "path": path}
    column = pa.array(values, type=table.schema.field(IMAGE).type)
    pq.write_table(table.set_column(table.schema.get_field_index(IMAGE), IMAGE, column), file)


def _png(mode: str, size: tuple[int, int] = (16, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format="PNG")
    return buffer.getvalue()


def _edit_info(root: Path, **feature_changes) -> None:
    info = json.loads((root / INFO_PATH).read_text())
    info["features"][IMAGE].update(feature_changes)
    (root / INFO_PATH).write_text(json.dumps(info))


BAD = {
    "grayscale image": (
        lambda r: _rewrite_image(r, 5, _png("L")),
        "episode 1 frame 1: 'observation.image' is a 16x16 L image",
    ),
    "other size": (
        lambda r: _rewrite_image(r, 2, _png("RGB", (8, 16))),
        "episode 0 frame 2: 'observation.image' is a 16x8 RGB image, info.json says 16x16 RGB",
    ),
    "not an image": (
        lambda r: _rewrite_image(r, 1, b"not a png"),
        "episode 0 frame 1: 'observation.image' does not decode",
    ),
    "no embedded bytes": (
        lambda r: _rewrite_image(r, 3, None),
        "episode 0 frame 3: 'observation.image' holds no image bytes",
    ),
    "one channel in info.json": (
        lambda r: _edit_info(r, shape=[16, 16, 1]),
        "image feature 'observation.image' has 1 channels",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_images_are_one_clear_line(tmp_path, case):
    src = shutil.copytree(DATASET, tmp_path / "bad")
    damage, expected = BAD[case]
    damage(src)
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(src, tmp_path / "out" / "v1")
    message = str(excinfo.value)
    assert "\n" not in message and expected in message, message
    assert not (tmp_path / "out" / "v1").exists()
