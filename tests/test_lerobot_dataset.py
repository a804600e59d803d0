"""LeRobotDataset import (v3.0 and v2.1) and export, on tiny datasets built on the fly (16x16 frames).

The reference is the zarr path: the same arrays, with the frames the videos decode to, written through the
PushT zarr importer must give identical batches (windows, padding masks) and statistics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zarr

from lerobot.cli import export_main
from lerobot.config import DatasetConfig, EnvConfig, FeatureConfig
from lerobot.datasets import EpisodeDataset, make_dataset
from lerobot.datasets.factory import dataset_format
from lerobot.datasets.lerobot_export import encode_video, export_lerobot_dataset
from lerobot.datasets.lerobot_format import INFO_PATH, LEGACY_EPISODES_STATS_PATH, STATS_PATH
from lerobot.datasets.lerobot_frames import decode_video_into
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.datasets.pusht_import import convert_pusht_zarr
from lerobot.errors import ConfigError, DatasetError, DatasetNotFoundError

REPO_ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [3, 5, 4, 6]
SIZE = 16
FPS = 10
DP_DELTA = {
    "observation.image": [-0.1, 0.0],
    "observation.state": [-0.1, 0.0],
    "action": [round(0.1 * k, 1) for k in range(-1, 15)],
}
KEYS = ["observation.image", "observation.state", "observation.environment_state", "action", "next.reward"]


def smooth_frames(n: int, seed: int) -> np.ndarray:
    """(n, H, W, 3) uint8 frames that AV1 keeps close: moving blobs on a gradient."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    frames = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    for i in range(n):
        cx, cy = rng.uniform(3, SIZE - 3, 2)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 20.0)
        frames[i, ..., 0] = 40 + 180 * blob
        frames[i, ..., 1] = 60 + 8 * xx
        frames[i, ..., 2] = 200 - 120 * blob
    return frames


def write_zarr(path: Path, images: np.ndarray, state: np.ndarray, action: np.ndarray) -> Path:
    """A PushT-shaped zarr (what Diffusion Policy ships) holding these arrays."""
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    data, meta = group.require_group("data"), group.require_group("meta")
    data.create_array("img", data=images.astype(np.float32), chunks=(4, SIZE, SIZE, 3))
    data.create_array("state", data=state)
    data.create_array("action", data=action)
    meta.create_array("episode_ends", data=np.cumsum(LENGTHS).astype(np.int64))
    return path


def decode_all(paths: list[Path]) -> np.ndarray:
    """Every frame of the mp4s, in order, (N, H, W, 3) uint8: the plain PyAV decode, as a reference."""
    frames = []
    for path in paths:
        with av.open(str(path)) as container:
            frames += [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    return np.stack(frames)


def env_cfg() -> EnvConfig:
    return EnvConfig(
        name="pusht",
        fps=FPS,
        features={
            "observation.image": FeatureConfig(shape=[3, SIZE, SIZE], kind="visual"),
            "observation.state": FeatureConfig(shape=[2], kind="state"),
            "action": FeatureConfig(shape=[2], kind="action"),
        },
    )


def to_v21(v3: Path, out: Path) -> Path:
    """Rewrite an exported v3.0 dataset in the v2.1 layout: one parquet and one mp4 per episode, jsonl metadata."""
    info = json.loads((v3 / INFO_PATH).read_text())
    tables = [pq.read_table(p) for p in sorted((v3 / "data").rglob("*.parquet"))]
    table = pa.concat_tables(tables)
    frames = decode_all(sorted((v3 / "videos").rglob("*.mp4")))
    (out / "meta").mkdir(parents=True)
    stats = json.loads((v3 / STATS_PATH).read_text())
    ep_col = table.column("episode_index").to_numpy()
    episodes, episodes_stats = [], []
    for e, length in enumerate(LENGTHS):
        rows = np.flatnonzero(ep_col == e)
        part = table.slice(int(rows[0]), len(rows))
        data_path = out / f"data/chunk-000/episode_{e:06d}.parquet"
        data_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, data_path)
        video_path = out / f"videos/chunk-000/observation.image/episode_{e:06d}.mp4"
        video_path.parent.mkdir(parents=True, exist_ok=True)
        encode_video(video_path, [frames[rows].transpose(0, 3, 1, 2)], FPS)
        episodes.append({"episode_index": e, "tasks": ["tiny"], "length": length})
        ep_stats = {}
        for key in ("observation.state", "action", "observation.environment_state", "next.reward"):
            values = np.asarray(part.column(key).to_pylist(), dtype=np.float64).reshape(len(rows), -1)
            ep_stats[key] = {
                "min": values.min(0).tolist(),
                "max": values.max(0).tolist(),
                "count": [len(rows)],
            }
        ep_stats["observation.image"] = stats["observation.image"]
        episodes_stats.append({"episode_index": e, "stats": ep_stats})
    info.update(
        codebase_version="v2.1",
        data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        video_path="videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        total_chunks=1,
        total_videos=len(LENGTHS),
    )
    for key in ("data_files_size_in_mb", "video_files_size_in_mb"):
        info.pop(key)
    (out / INFO_PATH).write_text(json.dumps(info))
    (out / "meta/episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in episodes))
    (out / LEGACY_EPISODES_STATS_PATH).write_text("".join(json.dumps(r) + "\n" for r in episodes_stats))
    (out / "meta/tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "tiny"}) + "\n")
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The original (zarr -> converted), its v3.0 export (2 episodes per file), and its v2.1 rewrite."""
    base = tmp_path_factory.mktemp("lerobot")
    n = sum(LENGTHS)
    rng = np.random.default_rng(0)
    state = np.column_stack([rng.uniform(50, 450, (n, 4)), rng.uniform(0, 2 * np.pi, n)]).astype(np.float32)
    action = rng.uniform(0, 512, (n, 2)).astype(np.float32)
    original = convert_pusht_zarr(
        write_zarr(base / "a.zarr", smooth_frames(n, 0), state, action), base / "converted" / "v1"
    )
    v3 = export_lerobot_dataset(original, base / "tiny_v3", task="tiny", episodes_per_file=2)
    v21 = to_v21(v3, base / "tiny_v21")
    # The zarr path over the very frames each layout's videos decode to (converted by `make_dataset`).
    twins = {}
    for name, root in (("v3", v3), ("v21", v21)):
        twins[name] = base / f"twin_{name}"
        frames = decode_all(sorted((root / "videos").rglob("*.mp4")))
        write_zarr(twins[name] / "pusht_cchi_v7_replay.zarr", frames, state, action)
    return {
        "base": base,
        "original": original,
        "v3": v3,
        "v21": v21,
        **{f"twin_{k}": v for k, v in twins.items()},
    }


def lerobot_cfg(tiny, root: Path) -> DatasetConfig:
    return DatasetConfig(
        repo_id="test/tiny", root=str(root), cache_dir=str(tiny["base"] / f"cache_{root.name}")
    )


# ---------------------------------------------------------------------------------------------- importing


@pytest.mark.parametrize("layout", ["v3", "v21"])
def test_import_trains_like_the_zarr_path(tiny, layout):
    """Same windows, padding masks, frames and statistics as the zarr importer given the decoded frames."""
    cfg = lerobot_cfg(tiny, tiny[layout])
    assert dataset_format(cfg) == "lerobot"
    ours = make_dataset(cfg, env_cfg(), DP_DELTA, keys=["observation.environment_state", "next.reward"])
    twin = make_dataset(
        DatasetConfig(root=str(tiny[f"twin_{layout}"]), cache_dir=str(tiny["base"] / f"cache_twin_{layout}")),
        env_cfg(),
        DP_DELTA,
        keys=["observation.environment_state", "next.reward"],
    )
    assert len(ours) == len(twin) == sum(LENGTHS)
    got, want = ours.__getitems__(range(len(ours))), twin.__getitems__(range(len(twin)))
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert got["action_is_pad"].any() and got["observation.image_is_pad"].any()
    for key in KEYS:
        for name in ("mean", "std", "min", "max"):
            torch.testing.assert_close(ours.stats[key][name], twin.stats[key][name], rtol=1e-6, atol=1e-7)


def test_import_with_val_split_and_meta(tiny):
    cfg = lerobot_cfg(tiny, tiny["v3"])
    cfg.val_fraction = 0.25
    train, val = (
        make_dataset(cfg, env_cfg(), None, split="train"),
        make_dataset(cfg, env_cfg(), None, split="val"),
    )
    assert train.num_episodes == 3 and val.num_episodes == 1
    assert train.meta["source"]["format"] == "lerobot" and train.meta["source"]["codebase_version"] == "v3.0"
    assert train.meta["features"]["observation.state"]["kind"] == "state"


def test_round_trip_vectors_identical_frames_within_video_tolerance(tiny):
    """export -> import gives the original vectors bit for bit and the frames within AV1's loss."""
    out = convert_lerobot_dataset(tiny["v3"], tiny["base"] / "roundtrip" / "v1")
    original, back = EpisodeDataset(tiny["original"]), EpisodeDataset(out)
    assert back.meta["episode_ends"] == original.meta["episode_ends"]
    for key in original.keys:
        a, b = np.load(tiny["original"] / f"{key}.npy"), np.load(out / f"{key}.npy")
        if key == "observation.image":
            assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
            diff = np.abs(a.astype(np.int16) - b).mean(axis=(1, 2, 3))
            assert diff.mean() < 8.0, diff.mean()  # AV1 CRF 30 on 16x16 frames; on PushT's 96x96: ~1 level
            # Each frame is its own original's, not a neighbour's (timestamps matched to the right frame).
            shifted = np.abs(a[1:].astype(np.int16) - b[:-1]).mean(axis=(1, 2, 3))
            assert np.all(diff[:-1] < shifted) and np.all(diff[1:] < shifted)
        else:
            assert np.array_equal(a, b), key
    for key in ("timestamp", "frame_index", "episode_index"):
        assert np.array_equal(np.load(tiny["original"] / f"{key}.npy"), np.load(out / f"{key}.npy"))


def test_import_is_reused_until_the_source_changes(tiny, tmp_path):
    src = shutil.copytree(tiny["v3"], tmp_path / "v3")
    out = convert_lerobot_dataset(src, tmp_path / "out" / "v1")
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert convert_lerobot_dataset(src, out) == out and (out / "meta.json").stat().st_mtime_ns == stamp
    path = src / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = table.column("next.reward").to_numpy().copy()
    column[0] = 0.5
    pq.write_table(
        table.set_column(table.schema.get_field_index("next.reward"), "next.reward", pa.array(column)), path
    )
    _set_stats(src, "next.reward", "min", [float(column.min())])
    _set_stats(src, "next.reward", "max", [float(column.max())])
    convert_lerobot_dataset(src, out)
    assert np.load(out / "next.reward.npy")[0] == 0.5


def _stats(root: Path) -> dict:
    return json.loads((root / STATS_PATH).read_text())


def _set_stats(root: Path, key: str, name: str, value: list[float]) -> None:
    stats = _stats(root)
    stats[key][name] = value
    (root / STATS_PATH).write_text(json.dumps(stats))


# ------------------------------------------------------------------------------------------- bad inputs


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def _rewrite_episodes(root: Path, column: str, shift: float) -> None:
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    values = table.column(column).to_numpy() + shift
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(values)), path)


def _rewrite_data(root: Path, column: str, fn) -> None:
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    values = fn(table.column(column).to_numpy().copy())
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(values)), path)


BAD_V3 = {
    "missing video": (
        lambda r: (r / "videos/observation.image/chunk-000/file-001.mp4").unlink(),
        "file-001.mp4: missing video",
    ),
    "video shifted against the parquet timestamps": (
        lambda r: _rewrite_episodes(r, "videos/observation.image/from_timestamp", 0.05),
        "no frame within 0.0001 s of timestamp",
    ),
    "timestamps not frame_index / fps": (
        lambda r: _rewrite_data(r, "timestamp", lambda t: t + np.float32(0.01) * (np.arange(len(t)) == 1)),
        "episode 0 frame 1: timestamp 0.110000 s is not frame_index / fps",
    ),
    "missing stats": (lambda r: (r / STATS_PATH).unlink(), "stats.json: missing"),
    "stats of other data": (lambda r: _set_stats(r, "action", "max", [1e6, 1e6]), "action max is [1000000.0"),
    "wrong codebase_version": (
        lambda r: (r / INFO_PATH).write_text(
            json.dumps({**json.loads((r / INFO_PATH).read_text()), "codebase_version": "v2.0"})
        ),
        "codebase_version 'v2.0' is not supported",
    ),
    "missing data file": (
        lambda r: (r / "data/chunk-000/file-001.parquet").unlink(),
        "file-001.parquet: missing",
    ),
    "episode length disagrees": (
        lambda r: _rewrite_episodes(r, "length", 1),
        "episode 0 has 3 rows",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_V3))
def test_bad_v3_input_is_one_clear_line(tiny, tmp_path, case):
    src = shutil.copytree(tiny["v3"], tmp_path / "bad")
    damage, expected = BAD_V3[case]
    damage(src)
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(src, tmp_path / "out" / "v1")
    assert expected in _one_line(excinfo)
    assert not (tmp_path / "out" / "v1").exists()
    assert not list((tmp_path / "out").glob(".v1.tmp-*"))  # nothing half-written is left behind


def test_bad_v21_inputs_are_one_clear_line(tiny, tmp_path):
    src = shutil.copytree(tiny["v21"], tmp_path / "bad")
    (src / "videos/chunk-000/observation.image/episode_000002.mp4").unlink()
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(src, tmp_path / "out" / "v1")
    assert "episode_000002.mp4: missing video" in _one_line(excinfo)
    (src / LEGACY_EPISODES_STATS_PATH).unlink()
    with pytest.raises(DatasetError) as excinfo:
        convert_lerobot_dataset(src, tmp_path / "out" / "v1")
    assert "episodes_stats.jsonl: missing" in _one_line(excinfo)


def test_missing_roots_and_offline_hub_are_one_clear_line(tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError) as excinfo:
        make_dataset(DatasetConfig(repo_id="test/tiny", root=str(tmp_path)), env_cfg())
    assert f"dataset.root={tmp_path}: no meta/info.json" in _one_line(excinfo)
    with pytest.raises(ConfigError, match="needs dataset.repo_id"):
        make_dataset(DatasetConfig(format="lerobot"), env_cfg())
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    with pytest.raises(DatasetNotFoundError) as excinfo:
        make_dataset(DatasetConfig(repo_id="test/absent"), env_cfg())
    message = _one_line(excinfo)
    assert "LeRobotDataset test/absent (revision v3.0) is not in the hub cache" in message
    assert f"put the dataset directory at {tmp_path / 'home' / 'test' / 'absent'}" in message


def test_lerobot_home_is_used_without_a_root(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path))
    shutil.copytree(tiny["v3"], tmp_path / "test" / "tiny")
    dataset = make_dataset(DatasetConfig(repo_id="test/tiny", cache_dir=str(tmp_path / "cache")), env_cfg())
    assert dataset.num_episodes == len(LENGTHS)


# ---------------------------------------------------------------------------------------------- exporting


def test_export_follows_lerobot_v30_schema(tiny):
    """What LeRobot 0.6's loader reads: info.json, parquet types, episode columns, tasks index, AV1 video."""
    root = tiny["v3"]
    info = json.loads((root / INFO_PATH).read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS and info["total_frames"] == sum(LENGTHS)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    image = info["features"]["observation.image"]
    assert image["dtype"] == "video" and image["shape"] == [SIZE, SIZE, 3]
    assert image["names"] == ["height", "width", "channels"]
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert info["features"][key]["shape"] == [1]
    # The data parquet holds exactly the non-video features: vectors as fixed-size lists, scalars plain.
    schema = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    assert set(schema.names) == {k for k, f in info["features"].items() if f["dtype"] != "video"}
    assert schema.field("observation.state").type == pa.list_(pa.float32(), 2)
    assert schema.field("next.reward").type == pa.float32() and schema.field("next.done").type == pa.bool_()
    assert pq.ParquetFile(root / "data/chunk-000/file-000.parquet").num_row_groups == 2  # one per episode
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert episodes["dataset_from_index"] == [0, 3, 8, 12] and episodes["length"] == LENGTHS
    assert episodes["data/file_index"] == [0, 0, 1, 1]
    assert episodes["videos/observation.image/from_timestamp"] == [0.0, 0.3, 0.0, 0.4]
    assert episodes["tasks"] == [["tiny"]] * 4
    assert np.asarray(episodes["stats/observation.image/mean"][0]).shape == (3, 1, 1)
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.to_pydict() == {"task_index": [0], "task": ["tiny"]}
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    stats = json.loads((root / STATS_PATH).read_text())
    assert np.asarray(stats["observation.image"]["mean"]).shape == (3, 1, 1)
    assert stats["action"]["count"] == [sum(LENGTHS)] and len(stats["action"]["std"]) == 2
    with av.open(str(root / "videos/observation.image/chunk-000/file-001.mp4")) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name in ("libdav1d", "av1", "libaom-av1")
        assert stream.format.name == "yuv420p" and stream.average_rate == FPS
        assert stream.frames == LENGTHS[2] + LENGTHS[3]


def test_encoding_leaves_the_process_scheduling_alone(tmp_path):
    """SVT-AV1 makes its caller real-time (SCHED_FIFO) where it may; children would inherit that."""
    before = os.sched_getscheduler(0)
    encode_video(tmp_path / "v.mp4", [np.zeros((4, 3, SIZE, SIZE), dtype=np.uint8)], FPS)
    assert os.sched_getscheduler(0) == before
    frames = np.empty((4, 3, SIZE, SIZE), dtype=np.uint8)
    decode_video_into(tmp_path / "v.mp4", np.arange(4) / FPS, frames, np.arange(4))
    assert os.sched_getscheduler(0) == before


def test_export_script_writes_and_refuses_to_overwrite(tiny, tmp_path, capsys):
    out = tmp_path / "exported"
    cache = tiny["base"] / "cache_script"
    overrides = [f"dataset.root={tiny['v3']}", "dataset.repo_id=test/tiny", f"dataset.cache_dir={cache}"]
    assert export_main(["--out", str(out), "--task", "tiny", *overrides]) == 0
    assert (out / INFO_PATH).is_file()
    assert export_main(["--out", str(out), *overrides]) == 2
    assert "already exists" in capsys.readouterr().err
    assert export_main(["--out", str(tmp_path / "x"), "dataset.nope=1"]) == 2


LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_VENV", "lerobot-venv")) / "bin" / "python"


def _run_lerobot(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run LeRobot's Python away from this repository: its `lerobot` must not be shadowed by ours.

    `$LEROBOT_PYTHONPATH` may add LeRobot's `dataset` extra (datasets, pandas, av) installed elsewhere.
    """
    env = {**os.environ, "PYTHONPATH": os.environ.get("LEROBOT_PYTHONPATH", "")}
    return subprocess.run([str(LEROBOT_PYTHON), *args], capture_output=True, text=True, env=env, cwd=cwd)


def _lerobot_importable() -> bool:
    if not LEROBOT_PYTHON.is_file():
        return False
    # The dataset extra (datasets, pandas) is optional in LeRobot: without it the import below fails.
    return _run_lerobot(["-c", "from lerobot.datasets import LeRobotDataset"], Path("/")).returncode == 0


@pytest.mark.skipif(
    not _lerobot_importable(), reason=f"no LeRobot with its dataset extra at {LEROBOT_PYTHON} ($LEROBOT_VENV)"
)
def test_lerobot_itself_loads_the_export(tiny):
    """Optional: LeRobot's own LeRobotDataset reads the export (a Python with LeRobot 0.6 installed)."""
    script = (
        "import sys, json; from lerobot.datasets import LeRobotDataset\n"
        "ds = LeRobotDataset('test/tiny', root=sys.argv[1], delta_timestamps={'action': [0.0, 0.1]})\n"
        "item = ds[4]\n"
        "print(json.dumps({'n': len(ds), 'img': list(item['observation.image'].shape),"
        " 'action': item['action'].tolist(), 'pad': item['action_is_pad'].tolist(), 'task': item['task']}))\n"
    )
    run = _run_lerobot(["-c", script, str(tiny["v3"])], tiny["base"])
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    original = EpisodeDataset(tiny["original"], delta_timestamps={"action": [0.0, 0.1]})
    assert got["n"] == sum(LENGTHS) and got["img"] == [3, SIZE, SIZE] and got["task"] == "tiny"
    np.testing.assert_array_equal(np.asarray(got["action"], dtype=np.float32), original[4]["action"].numpy())
    assert got["pad"] == original[4]["action_is_pad"].tolist()


def test_train_cli_with_a_wrong_lerobot_root_is_one_line(tmp_path):
    """`dataset.repo_id=... dataset.root=DIR` on the command line reaches the importer: one line, exit 2."""
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/train.py"), "policy=diffusion", "env=pusht",
         "dataset.repo_id=lerobot/pusht", f"dataset.root={tmp_path}", f"output_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"error: dataset.root={tmp_path}: no meta/info.json; point dataset.root at the LeRobotDataset "
        "directory (the one holding meta/, data/, videos/)"
    )
