"""Dataset edits (`scripts/edit_dataset.py`): delete, split, merge, remove-feature, keep-tasks on LeRobotDatasets
v3.0 built on the fly (16x16 videos, several episodes per file) and on LeRobot's own recording
(`tests/fixtures/lerobot_metaworld`: camera images in the parquet rows, quantile statistics).

The reference is the source itself: imported by this project (`convert_lerobot_dataset`), an edit must hold
exactly the source's frames of the kept episodes (the videos are the same files, so even the pixels are
identical), renumbered, with statistics recomputed over them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot.cli.edit import edit_main
from lerobot.config import DatasetConfig, EnvConfig, FeatureConfig
from lerobot.constants import ACTION, NEXT_DONE, NEXT_REWARD, NEXT_SUCCESS, OBS_IMAGE, OBS_STATE
from lerobot.datasets import edit_write, make_dataset
from lerobot.datasets.edit import (
    TRAIN,
    VAL,
    delete_episodes,
    keep_tasks,
    merge_datasets,
    remove_features,
    split_dataset,
)
from lerobot.datasets.edit_select import open_edit_source
from lerobot.datasets.factory import split_episodes
from lerobot.datasets.format import (
    EPISODE_INDEX,
    FRAME_INDEX,
    TIMESTAMP,
    combine_episode_stats,
    feature_file,
    read_meta,
    sufficient_stats,
    uint8_channel_stats,
    write_meta,
    write_stats,
)
from lerobot.datasets.lerobot_export import export_lerobot_dataset
from lerobot.datasets.lerobot_format import EPISODES_PATH, INFO_PATH, STATS_PATH, TASKS_PATH
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.errors import DatasetExistsError

REPO_ROOT = Path(__file__).resolve().parents[1]
METAWORLD = REPO_ROOT / "tests" / "fixtures" / "lerobot_metaworld" / "dataset"
FPS, SIZE = 10, 16
# Dataset "a": 6 episodes, 2 per file; "b": 3 episodes in one file, one task shared with "a".
LENGTHS_A, TASKS_A = [3, 5, 4, 6, 2, 4], ["pick", "place", "pick", "place", "pick", "place"]
SUCCESS_A = [True, False, True, False, False, True]
LENGTHS_B, TASKS_B, SUCCESS_B = [4, 3, 5], ["place", "push", "push"], [False, True, True]
NUMERIC = [OBS_STATE, ACTION, NEXT_REWARD]


def _build(root: Path, lengths: list[int], tasks: list[str], success: list[bool], per_file: int) -> Path:
    """A LeRobotDataset v3.0 at `root` (written by the exporter from a dataset in this project's format):
    a camera, a state, an action, reward, success on the last frame of the successful episodes, done."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    n = int(ends[-1])
    episode = np.repeat(np.arange(len(lengths)), lengths)
    frame = np.arange(n) - starts[episode]
    last = frame == np.asarray(lengths)[episode] - 1
    rng = np.random.default_rng(len(root.name) + n)
    level = (40 + 7 * np.arange(n)) % 220  # every frame a distinct brightness, smooth within a frame
    ramp = np.arange(SIZE)[None, None, :, None] + np.array([0, 10, 20])[None, :, None, None]  # (1, 3, H, 1)
    arrays = {
        OBS_IMAGE: np.broadcast_to(level[:, None, None, None] + ramp, (n, 3, SIZE, SIZE)).astype(np.uint8),
        OBS_STATE: rng.uniform(0, 512, (n, 2)).astype(np.float32),
        ACTION: rng.uniform(0, 512, (n, 2)).astype(np.float32),
        NEXT_REWARD: rng.uniform(0, 1, n).astype(np.float32),
        NEXT_SUCCESS: last & np.asarray(success)[episode],
        NEXT_DONE: last,
    }
    converted = root.parent / f"{root.name}.converted"
    converted.mkdir()
    features, per_episode = {}, {}
    for key, values in arrays.items():
        np.save(feature_file(converted, key), values)
        stats = uint8_channel_stats if key == OBS_IMAGE else sufficient_stats
        per_episode[key] = [stats(values[s:e]) for s, e in zip(starts, ends)]
        kind = "visual" if key == OBS_IMAGE else "other"
        features[key] = {"shape": list(values.shape[1:]), "dtype": str(values.dtype), "kind": kind}
    bookkeeping = {EPISODE_INDEX: episode, FRAME_INDEX: frame, TIMESTAMP: (frame / FPS).astype(np.float32)}
    for key, values in bookkeeping.items():
        np.save(feature_file(converted, key), values)
        features[key] = {"shape": [], "dtype": str(values.dtype), "kind": "other"}
    write_stats(converted, *combine_episode_stats(per_episode, len(lengths)))
    write_meta(converted, root.name, FPS, ends, features)
    return export_lerobot_dataset(converted, root, task=tasks, episodes_per_file=per_file)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Datasets "a" and "b" (see above), LeRobot's recording, and `base`, where imports and builds go."""
    base = tmp_path_factory.mktemp("edit")
    a = _build(base / "a", LENGTHS_A, TASKS_A, SUCCESS_A, per_file=2)
    b = _build(base / "b", LENGTHS_B, TASKS_B, SUCCESS_B, per_file=3)
    return {"base": base, "a": a, "b": b, "metaworld": METAWORLD}


def _import(root: Path, base: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta.json, every array) of `root` imported into this project's format."""
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    converted = convert_lerobot_dataset(root, base / "imports" / digest / "v1")
    meta = read_meta(converted)
    return meta, {k: np.load(feature_file(converted, k)) for k in meta["features"]}


def _frames_of(meta: dict, arrays: dict[str, np.ndarray], episodes: list[int]) -> dict[str, np.ndarray]:
    """The arrays restricted to `episodes`, in that order."""
    ends = np.asarray(meta["episode_ends"])
    starts = ends - np.diff(ends, prepend=0)
    rows = np.concatenate([np.arange(starts[e], ends[e]) for e in episodes])
    return {k: v[rows] for k, v in arrays.items()}


def _same_frames(edited: Path, sources: list[tuple[Path, list[int]]], base: Path) -> dict[str, np.ndarray]:
    """Assert that the import of `edited` holds exactly the sources' frames of those episodes, renumbered."""
    meta, got = _import(edited, base)
    parts = [_frames_of(*_import(root, base), episodes) for root, episodes in sources]
    assert sum(len(p[FRAME_INDEX]) for p in parts) == meta["num_frames"]
    for key, values in got.items():
        want = np.concatenate([p[key] for p in parts])
        if key == EPISODE_INDEX:
            ends = np.asarray(meta["episode_ends"])
            want = np.repeat(np.arange(len(ends)), np.diff(ends, prepend=0))
        np.testing.assert_array_equal(values, want, err_msg=key)
    return got


def _tree_digest(root: Path) -> str:
    """One hash of every file under `root` (names and bytes): the source must never change."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------- the edits


def test_delete_by_index_keeps_the_other_episodes_exactly(data, tmp_path):
    before = _tree_digest(data["a"])
    out = delete_episodes(data["a"], tmp_path / "deleted", episodes="1,3-4")
    assert _tree_digest(data["a"]) == before
    got = _same_frames(out, [(data["a"], [0, 2, 5])], data["base"])
    info = _json(out / INFO_PATH)
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 11, 2)
    episodes = pq.read_table(out / EPISODES_PATH.format(chunk_index=0, file_index=0)).to_pydict()
    assert episodes["tasks"] == [["pick"], ["pick"], ["place"]] and episodes["length"] == [3, 4, 4]
    assert episodes["dataset_from_index"] == [0, 3, 7] and episodes["dataset_to_index"] == [3, 7, 11]
    # Episodes 0, 2, 5 lie in source files 0, 1, 2 at 0.0, 0.0, 0.2 s: the copies keep those times.
    assert episodes[f"videos/{OBS_IMAGE}/file_index"] == [0, 1, 2]
    assert episodes[f"videos/{OBS_IMAGE}/from_timestamp"] == pytest.approx([0.0, 0.0, 0.2])
    stats = _json(out / STATS_PATH)
    for key in NUMERIC:
        values = got[key].astype(np.float64).reshape(len(got[key]), -1)
        for name, want in (("mean", values.mean(0)), ("std", values.std(0)), ("min", values.min(0))):
            np.testing.assert_allclose(stats[key][name], want, rtol=1e-9, atol=1e-12, err_msg=f"{key} {name}")
        assert stats[key]["count"] == [11]
    # Camera statistics pool the source's per-episode ones: those of the frames it recorded (before encoding).
    recorded = np.load(feature_file(data["base"] / "a.converted", OBS_IMAGE))
    pixels = recorded[np.r_[0:3, 8:12, 20:24]].astype(np.float64) / 255
    np.testing.assert_allclose(np.ravel(stats[OBS_IMAGE]["mean"]), pixels.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(np.ravel(stats[OBS_IMAGE]["std"]), pixels.std(axis=(0, 2, 3)), rtol=1e-6)
    assert stats["index"]["max"] == [10] and stats[EPISODE_INDEX]["max"] == [2]
    np.testing.assert_allclose(episodes[f"stats/{ACTION}/mean"][2], got[ACTION][7:].mean(0), rtol=1e-6)
    assert not list(tmp_path.glob(".deleted.tmp-*"))


def test_delete_where_success_length_and_task(data, tmp_path):
    """`success` is whether an episode's `next.success` is ever set, as evaluation records it."""
    out = delete_episodes(data["a"], tmp_path / "successes", where=["success=false"])
    _same_frames(out, [(data["a"], [0, 2, 5])], data["base"])
    out = delete_episodes(data["a"], tmp_path / "long", where=["length<4"])  # lengths 3 and 2 go
    assert open_edit_source(out).episodes["length"] == [5, 4, 6, 4]
    out = delete_episodes(data["a"], tmp_path / "both", episodes=[0], where=["task=pick", "success==false"])
    assert open_edit_source(out).episodes["length"] == [5, 4, 6, 4]  # episode 0 by index, 4 by condition


def test_split_draws_the_training_split_and_takes_lists(data, tmp_path):
    parts = split_dataset(data["a"], tmp_path / "split", val_fraction=0.34, seed=3)
    train, val = split_episodes(len(LENGTHS_A), 0.34, 3)
    assert parts == {TRAIN: tmp_path / "split" / TRAIN, VAL: tmp_path / "split" / VAL}
    _same_frames(parts[TRAIN], [(data["a"], train)], data["base"])
    _same_frames(parts[VAL], [(data["a"], val)], data["base"])
    parts = split_dataset(data["a"], tmp_path / "listed", val_episodes="1,4")
    assert open_edit_source(parts[VAL]).episodes["length"] == [5, 2]
    assert open_edit_source(parts[TRAIN]).num_episodes == 4


def test_merge_renumbers_episodes_and_joins_tasks_by_text(data, tmp_path, monkeypatch):
    out = merge_datasets([data["a"], data["b"]], tmp_path / "merged")
    got = _same_frames(out, [(data["a"], list(range(6))), (data["b"], [0, 1, 2])], data["base"])
    assert pq.read_table(out / TASKS_PATH).to_pydict()["task"] == ["pick", "place", "push"]
    rows = pq.read_table(out / "data/chunk-000/file-000.parquet").to_pydict()
    names = ["pick", "place", "push"]
    want = np.repeat([names.index(t) for t in TASKS_A + TASKS_B], LENGTHS_A + LENGTHS_B)
    assert rows["task_index"] == want.tolist() and rows["index"] == list(range(len(got[ACTION])))
    videos = sorted(p.name for p in (out / "videos" / OBS_IMAGE).rglob("*.mp4"))
    assert videos == ["file-000.mp4", "file-001.mp4", "file-002.mp4", "file-003.mp4"]  # 3 of a, 1 of b
    assert _json(out / STATS_PATH)[ACTION]["count"] == [sum(LENGTHS_A + LENGTHS_B)]
    # Data files full after every episode (DATA_FILES_SIZE_IN_MB): one file per episode, read back the same.
    monkeypatch.setattr(edit_write, "DATA_FILES_SIZE_IN_MB", 0)
    out = merge_datasets([data["b"], data["a"]], tmp_path / "small_files")
    _same_frames(out, [(data["b"], [0, 1, 2]), (data["a"], list(range(6)))], data["base"])
    assert len(list(out.glob("data/*/*.parquet"))) == 9


def test_remove_feature_and_keep_tasks(data, tmp_path):
    out = remove_features(data["a"], tmp_path / "state_only", [OBS_IMAGE, NEXT_REWARD])
    info = _json(out / INFO_PATH)
    assert OBS_IMAGE not in info["features"] and NEXT_REWARD not in info["features"]
    assert info["video_path"] is None and not (out / "videos").exists()
    assert NEXT_REWARD not in pq.read_schema(out / "data/chunk-000/file-000.parquet").names
    assert set(_json(out / STATS_PATH)).isdisjoint({OBS_IMAGE, NEXT_REWARD})
    meta, _ = _import(out, data["base"])
    assert OBS_IMAGE not in meta["features"] and meta["num_frames"] == sum(LENGTHS_A)
    out = keep_tasks(data["a"], tmp_path / "place", ["place"])
    _same_frames(out, [(data["a"], [1, 3, 5])], data["base"])
    assert pq.read_table(out / TASKS_PATH).to_pydict() == {"task_index": [0], "task": ["place"]}


def test_an_edit_trains_through_make_dataset(data, tmp_path):
    out = delete_episodes(data["a"], tmp_path / "train_me", where=["success=false"])
    env = EnvConfig(
        name="tiny",
        fps=FPS,
        features={
            OBS_IMAGE: FeatureConfig(shape=[3, SIZE, SIZE], kind="visual"),
            OBS_STATE: FeatureConfig(shape=[2], kind="state"),
            ACTION: FeatureConfig(shape=[2], kind="action"),
        },
    )
    cfg = DatasetConfig(repo_id="test/edited", root=str(out), cache_dir=str(tmp_path / "cache"))
    dataset = make_dataset(cfg, env, {ACTION: [0.0, 0.1, 0.2], OBS_IMAGE: [-0.1, 0.0]})
    assert dataset.num_episodes == 3 and len(dataset) == 11
    batch = dataset.__getitems__(range(len(dataset)))
    assert batch[ACTION].shape == (11, 3, 2) and batch[f"{ACTION}_is_pad"].any()
    want = _frames_of(*_import(data["a"], data["base"]), [0, 2, 5])[ACTION]
    torch.testing.assert_close(dataset.stats[ACTION]["mean"], torch.tensor(want.mean(0)))


def test_lerobot_recording_keeps_its_images_and_quantiles(data, tmp_path):
    """LeRobot 0.6.1's own recording: PNG frames in the parquet rows, `qNN` statistics, Hugging Face schema."""
    out = delete_episodes(data["metaworld"], tmp_path / "mw", episodes="1")
    got = _same_frames(out, [(data["metaworld"], [0, 2, 3])], data["base"])
    stats = _json(out / STATS_PATH)
    state = got[OBS_STATE].astype(np.float64)
    for name, level in (("q01", 0.01), ("q50", 0.5), ("q99", 0.99)):
        np.testing.assert_allclose(stats[OBS_STATE][name], np.quantile(state, level, axis=0), rtol=1e-12)
    assert np.asarray(stats[OBS_IMAGE]["q50"]).shape == (3, 1, 1)
    out = remove_features(data["metaworld"], tmp_path / "mw_no_image", [OBS_IMAGE])
    schema = pq.read_schema(out / "data/chunk-000/file-000.parquet")
    assert OBS_IMAGE not in json.loads(schema.metadata[b"huggingface"])["info"]["features"]


def test_a_failed_edit_leaves_nothing(data, tmp_path, monkeypatch):
    def full_disk(*args):
        raise OSError(28, "No space left on device", str(args[1]))

    before = _tree_digest(data["a"])
    monkeypatch.setattr(edit_write.shutil, "copyfile", full_disk)
    with pytest.raises(OSError, match="No space left"):
        delete_episodes(data["a"], tmp_path / "full", episodes="0")
    assert list(tmp_path.iterdir()) == [] and _tree_digest(data["a"]) == before
    (tmp_path / "taken").mkdir()
    with pytest.raises(DatasetExistsError, match="already exists"):
        keep_tasks(data["a"], tmp_path / "taken", ["pick"])


# ---------------------------------------------------------------------------------------------- the command


def _errors(data: dict[str, Path], tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (arguments, what the one error line says)."""
    a, out = str(data["a"]), ["--out", str(tmp / "out")]
    (tmp / "exists").mkdir(exist_ok=True)
    no_reward = data["base"] / "a_no_reward"
    if not no_reward.exists():
        remove_features(data["a"], no_reward, [NEXT_REWARD, NEXT_SUCCESS])
    return {
        "unknown episode": (["delete", a, "--episodes", "2,9", *out], "episode 9 is not in"),
        "bad episode list": (["delete", a, "--episodes", "2,x", *out], "'x' is not an episode index"),
        "nothing left": (["delete", a, "--episodes", "0-5", *out], "deletes all 6 episodes"),
        "features differ": (["merge", a, str(no_reward), *out], "feature 'next.reward' is in"),
        "output exists": (["keep-tasks", a, "pick", "--out", str(tmp / "exists")], "exists: already exists"),
        "unknown feature": (["remove-feature", a, "nope", *out], "feature 'nope' is not in"),
        "bookkeeping": (["remove-feature", a, "timestamp", *out], "bookkeeping columns"),
        "unknown task": (["keep-tasks", a, "fly", *out], "task 'fly' is not a task of"),
        "unknown field": (["delete", a, "--where", "color=red", *out], "has no episode field 'color'"),
        "no success": (
            ["delete", str(no_reward), "--where", "success=false", *out],
            "no next.success feature",
        ),
        "bad condition": (["delete", a, "--where", "success", *out], "expected FIELD OP VALUE"),
        "bad fraction": (["split", a, "--val-fraction", "0.99", *out], "leaves no training episode"),
        "out inside source": (["delete", a, "--episodes", "0", "--out", f"{a}/x"], "lies inside the source"),
    }


def test_bad_input_is_one_error_line_and_exit_2(data, tmp_path, capsys):
    for case, (args, expected) in _errors(data, tmp_path).items():
        assert edit_main(args) == 2, case
        err = capsys.readouterr().err.strip().splitlines()
        assert [line for line in err if line.startswith("error:")] == [err[-1]], case
        assert expected in err[-1], (case, err[-1])
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*")), case


def test_script_writes_and_says_so(data, tmp_path):
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/edit_dataset.py"), "split", str(data["a"]),
         "--val-episodes", "0", "--out", str(tmp_path / "s")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"wrote {tmp_path / 's' / 'train'}: 5 episodes, 21 frames, 2 tasks" in run.stdout


# ------------------------------------------------------------------------------------ LeRobot's own loader

# A Python with LeRobot 0.6 and its `dataset` extra: `$LEROBOT_VENV/bin/python` (extra packages may come from
# `$LEROBOT_PYTHONPATH`). It runs away from this repository, whose `lerobot` would shadow LeRobot's.
LEROBOT_VENV = os.environ.get("LEROBOT_VENV")
LOAD_WITH_LEROBOT = """
import json, sys
from lerobot.datasets import LeRobotDataset
out = {}
for root in sys.argv[1:]:
    ds = LeRobotDataset("test/edited", root=root, video_backend="pyav")
    items = [ds[i] for i in range(len(ds))]
    out[root] = {
        "episodes": ds.num_episodes,
        "episode_index": [int(x["episode_index"]) for x in items],
        "tasks": [x["task"] for x in items],
        "action": [x["action"].tolist() for x in items],
        "image": [x["observation.image"].mul(255).round().tolist() for x in items],
    }
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not LEROBOT_VENV, reason="set $LEROBOT_VENV to a Python environment with LeRobot 0.6 installed"
)
def test_lerobot_itself_loads_the_edits(data, tmp_path, monkeypatch):
    """Optional: LeRobot's `LeRobotDataset` reads a delete (videos re-referenced), a merge (files of two
    sources, tasks joined, one data file per episode) and an edit of LeRobot's own recording, item for item
    as this project does."""
    python = Path(LEROBOT_VENV) / "bin" / "python"
    a, b, mw = data["a"], data["b"], data["metaworld"]
    edits = {  # the edit -> the episodes of the sources it holds
        delete_episodes(a, tmp_path / "deleted", episodes="1,3-4"): [(a, [0, 2, 5])],
        delete_episodes(mw, tmp_path / "mw", episodes="2"): [(mw, [0, 1, 3])],
    }
    monkeypatch.setattr(edit_write, "DATA_FILES_SIZE_IN_MB", 0)
    edits[merge_datasets([a, b], tmp_path / "merged")] = [(a, list(range(6))), (b, [0, 1, 2])]
    env = {**os.environ, "PYTHONPATH": os.environ.get("LEROBOT_PYTHONPATH", "")}
    run = subprocess.run(
        [str(python), "-c", LOAD_WITH_LEROBOT, *map(str, edits)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    if run.returncode != 0 and "No module named 'lerobot" in run.stderr:
        pytest.skip(f"no LeRobot at {python}")
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    for out, sources in edits.items():
        got, ours = loaded[str(out)], _same_frames(out, sources, data["base"])
        assert got["episodes"] == sum(len(episodes) for _, episodes in sources)
        tasks = pq.read_table(out / TASKS_PATH).to_pydict()["task"]
        assert got["episode_index"] == ours[EPISODE_INDEX].tolist()
        np.testing.assert_array_equal(np.asarray(got["action"], np.float32), ours[ACTION])
        task_index = [
            t
            for p in sorted(out.glob("data/*/*.parquet"))
            for t in pq.read_table(p)["task_index"].to_pylist()
        ]
        assert got["tasks"] == [tasks[t] for t in task_index]
        np.testing.assert_array_equal(np.asarray(got["image"]), ours[OBS_IMAGE])
