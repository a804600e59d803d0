"""LeRobot's MetaWorld datasets import: a LeRobotDataset laid out as `lerobot/metaworld_mt50` trains with
env=metaworld (state) and env=metaworld_pixels (camera frames resized at import with `dataset.image_size`),
each episode's task description becoming the `observation.task_index` the env declares.

The fixture `lerobot_metaworld` was recorded by LeRobot 0.6.1 itself (scripts/make_lerobot_fixtures.py
--kind metaworld): `lerobot/metaworld_mt50`'s features with a 3x32x32 camera, 4 episodes of 5,
4, 6 and 3 frames whose tasks are LeRobot's descriptions of reach-v3 and drawer-close-v3, alternating; its
`reference.safetensors` is what LeRobot's own `LeRobotDataset` returns for every frame.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.numpy import load_file

from lerobot.config import CONFIG_DIR, DatasetConfig, env_config, validate_config
from lerobot.datasets import EpisodeDataset, make_dataset
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.errors import ConfigError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot_metaworld"
DATASET = FIXTURE / "dataset"
LENGTHS = [5, 4, 6, 3]
EPISODE_TASKS = ["reach-v3", "drawer-close-v3", "reach-v3", "drawer-close-v3"]
DESCRIPTIONS = ["Reach a goal position", "Push and close a drawer"]
TASK = "observation.task_index"
IMAGE = "observation.image"
NEEDS_METAWORLD = "MetaWorld envs need the [mujoco] extra (metaworld==3.1.1)"


def _reference() -> tuple[dict[str, np.ndarray], list[str]]:
    """LeRobot's items for every frame, and each frame's task string."""
    with safe_open(FIXTURE / "reference.safetensors", "np") as f:
        tasks = json.loads(f.metadata()["tasks"])
    return load_file(FIXTURE / "reference.safetensors"), tasks


def _env(name: str):
    return env_config(validate_config({"env": OmegaConf.load(CONFIG_DIR / "env" / f"{name}.yaml")}))


def _data(tmp_path: Path, root: Path = DATASET, **fields) -> DatasetConfig:
    return DatasetConfig(format="lerobot", root=str(root), cache_dir=str(tmp_path / "cache"), **fields)


def _all_frames(dataset: EpisodeDataset) -> dict[str, torch.Tensor]:
    return dataset.__getitems__(np.arange(len(dataset)))


def _with_tasks(tmp_path: Path, tasks: list[str]) -> Path:
    """A copy of the fixture whose task table names its two tasks `tasks` instead."""
    root = tmp_path / "renamed"
    shutil.copytree(DATASET, root)
    path = root / "meta" / "tasks.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("task")
    pq.write_table(table.set_column(column, "task", pa.array(tasks, pa.large_string())), path)
    return root


def test_the_fixture_is_laid_out_as_lerobot_metaworld_mt50():
    info = json.loads((DATASET / "meta" / "info.json").read_text())
    assert (info["codebase_version"], info["fps"], info["robot_type"]) == ("v3.0", 80, "metaworld")
    features = info["features"]
    # Channels first, as metaworld_mt50 declares its 480x480 camera.
    assert features[IMAGE] == {
        "dtype": "image",
        "shape": [3, 32, 32],
        "names": ["channels", "height", "width"],
    }
    shapes = {k: (v["dtype"], v["shape"]) for k, v in features.items() if k != IMAGE}
    assert shapes["observation.state"] == ("float32", [4])
    assert shapes["observation.environment_state"] == ("float32", [39])
    assert shapes["action"] == ("float32", [4])
    assert shapes["task_id"] == ("int16", [1])
    assert shapes["task_index"] == ("int64", [1])
    tasks = pq.read_table(DATASET / "meta" / "tasks.parquet").to_pydict()
    assert sorted(zip(tasks["task_index"], tasks["task"])) == [(0, DESCRIPTIONS[0]), (1, DESCRIPTIONS[1])]
    assert info["total_episodes"] == 4 and info["total_frames"] == sum(LENGTHS)


def test_import_gives_lerobots_frames_vectors_and_task_table(tmp_path):
    reference, frame_tasks = _reference()
    out = convert_lerobot_dataset(DATASET, tmp_path / "converted")
    dataset = EpisodeDataset(out)
    batch = _all_frames(dataset)
    assert dataset.features[IMAGE] == (3, 32, 32)
    # Bit for bit the pixels LeRobot's loader returns (it gives them as value / 255).
    assert torch.equal(batch[IMAGE], torch.from_numpy(reference[IMAGE]).float() / 255)
    for key in ("observation.state", "observation.environment_state", "action"):
        assert torch.equal(batch[key], torch.from_numpy(reference[key]))
    assert torch.equal(batch["next.reward"], torch.from_numpy(reference["next.reward"]).reshape(-1))
    assert torch.equal(batch["task_id"], torch.from_numpy(reference["task_id"]).float().reshape(-1))
    assert torch.equal(batch["episode_index"], torch.from_numpy(reference["episode_index"]).reshape(-1))
    # LeRobot's task table and each episode's task_index, as LeRobot's loader resolves them per frame.
    assert dataset.meta["tasks"] == DESCRIPTIONS
    assert dataset.meta["episode_tasks"] == [[0], [1], [0], [1]]
    per_frame = [dataset.meta["tasks"][dataset.meta["episode_tasks"][e][0]] for e in batch["episode_index"]]
    assert per_frame == frame_tasks
    assert np.repeat([0, 1, 0, 1], LENGTHS).tolist() == reference["task_index"].reshape(-1).tolist()
    assert TASK not in dataset.keys  # LeRobot's dataset has no task id of ours: make_dataset derives it


@pytest.mark.parametrize("env_name", ["metaworld", "metaworld_pixels"])
def test_task_descriptions_become_the_envs_task_index(tmp_path, env_name):
    env = _env(env_name)
    names = env.features[TASK].names
    data = _data(tmp_path, image_size=[96, 96] if env_name == "metaworld_pixels" else None)
    dataset = make_dataset(data, env, delta_timestamps={TASK: [-1 / 80, 0.0]})
    batch = _all_frames(dataset)
    expected = np.repeat([names.index(t) for t in EPISODE_TASKS], LENGTHS)
    # reach-v3 is id 40, drawer-close-v3 17 (their places among the 50 sorted names).
    assert expected[:5].tolist() == [40] * 5 and expected[5:9].tolist() == [17] * 4
    # A window of the task id: the same id at both steps, the step before an episode's first frame padded.
    assert batch[TASK].shape == (sum(LENGTHS), 2)
    assert batch[TASK][:, 1].tolist() == expected.tolist()
    assert torch.equal(batch[TASK][:, 0], batch[TASK][:, 1])
    first_frames = np.cumsum([0, *LENGTHS[:-1]])
    assert np.flatnonzero(batch[TASK + "_is_pad"][:, 0].numpy()).tolist() == first_frames.tolist()
    stats = dataset.stats[TASK]
    assert (stats["min"].item(), stats["max"].item()) == (17.0, 40.0)
    assert stats["mean"].item() == pytest.approx(expected.mean())
    assert set(dataset.keys) == set(env.features)


def test_pixels_are_resized_at_import_and_the_size_is_its_own_conversion(tmp_path):
    reference, _ = _reference()
    env = _env("metaworld_pixels")
    with pytest.raises(ConfigError, match=r"has \[3, 32, 32\]; set dataset.image_size=\[96, 96\] to resize"):
        make_dataset(_data(tmp_path), env)
    dataset = make_dataset(_data(tmp_path, image_size=[96, 96]), env)
    assert dataset.root.name == "v1-96x96" and dataset.features[IMAGE] == (3, 96, 96)
    # 32 -> 96: each pixel covers a third of a source pixel, so the box filter repeats every pixel 3x3.
    upscaled = reference[IMAGE].repeat(3, axis=2).repeat(3, axis=3)
    assert torch.equal(_all_frames(dataset)[IMAGE], torch.from_numpy(upscaled).float() / 255)
    # 32 -> 16: each pixel is the mean of a 2x2 block, rounded (PIL rounds after each of its two passes, so
    # within 1 of the exact mean).
    small = EpisodeDataset(make_dataset(_data(tmp_path, image_size=[16, 16]), _env("metaworld")).root)
    assert small.root.name == "v1-16x16"
    means = reference[IMAGE].reshape(-1, 3, 16, 2, 16, 2).astype(np.float64).mean(axis=(3, 5))
    got = np.round(_all_frames(small)[IMAGE].numpy().astype(np.float64) * 255)
    assert np.abs(got - means).max() <= 1.0
    assert np.abs(got - means).mean() < 0.5


def test_unknown_and_ambiguous_task_strings_are_one_clear_error(tmp_path):
    env = _env("metaworld")
    unknown = _with_tasks(tmp_path / "a", [DESCRIPTIONS[0], "Fly to the moon"])
    with pytest.raises(
        ConfigError,
        match=r"task 'Fly to the moon' of episodes \[1, 3\] in the dataset at .* is not a task of "
        r"env.features.observation.task_index: expected one of its names \(e.g. 'assembly-v3'\) or descriptions",
    ):
        make_dataset(_data(tmp_path / "a", unknown), env)
    # LeRobot describes push-v3 and push-back-v3 alike (metaworld_mt50 has 49 task strings for 50 tasks).
    ambiguous = _with_tasks(tmp_path / "b", ["Push the puck to a goal", DESCRIPTIONS[1]])
    with pytest.raises(
        ConfigError, match=r"describes 2 tasks of .* \(push-back-v3, push-v3\), so it names none"
    ):
        make_dataset(_data(tmp_path / "b", ambiguous), env)
    # Told apart by the env's vocabulary (a YAML of one's own, docs/lerobot_dataset_io.md), the string names one.
    env.features[TASK].descriptions["push-back-v3"] = "(none in this dataset)"
    dataset = make_dataset(_data(tmp_path / "b", ambiguous), env)
    assert _all_frames(dataset)[TASK][:5].tolist() == [env.features[TASK].names.index("push-v3")] * 5
    # Task names work as well as descriptions (the project's own recordings use them).
    named = _with_tasks(tmp_path / "c", ["push-back-v3", "Push and close a drawer"])
    dataset = make_dataset(_data(tmp_path / "c", named), env)
    assert _all_frames(dataset)[TASK][:5].tolist() == [env.features[TASK].names.index("push-back-v3")] * 5


def test_without_a_vocabulary_or_a_task_table_the_task_input_is_missing(tmp_path):
    env = _env("metaworld")
    bare = env.features[TASK]
    bare.names, bare.descriptions = None, None
    with pytest.raises(
        ConfigError, match=r"has no feature \['observation.task_index'\] that env 'metaworld' needs"
    ):
        make_dataset(_data(tmp_path), env)
    env = _env("metaworld")
    env.features[TASK].names = env.features[TASK].names[:10]
    with pytest.raises(ConfigError, match=r"high=\[49.0\] but its names number 10 ids"):
        make_dataset(_data(tmp_path), env)


def test_image_size_is_checked_and_only_for_lerobot_datasets(tmp_path):
    with pytest.raises(ConfigError, match=r"dataset.image_size=\[96\]: expected \[height, width\]"):
        make_dataset(_data(tmp_path, image_size=[96]), _env("metaworld"))
    pusht = DatasetConfig(format="pusht_zarr", root=str(tmp_path), image_size=[96, 96])
    with pytest.raises(ConfigError, match="dataset.format=pusht_zarr keeps its frames as recorded"):
        make_dataset(pusht, _env("pusht"))


def test_the_yaml_vocabulary_is_the_envs_task_order_with_lerobots_descriptions():
    metaworld = pytest.importorskip("lerobot.envs.metaworld", reason=NEEDS_METAWORLD)
    for name in ("metaworld", "metaworld_pixels"):
        feature = _env(name).features[TASK]
        assert feature.names == metaworld.ALL_TASKS
        assert list(feature.descriptions) == metaworld.ALL_TASKS
        assert feature.descriptions["reach-v3"] == "Reach a goal position"
        assert len(set(feature.descriptions.values())) == 49  # push-v3 and push-back-v3 share one
    assert _env("metaworld").features[TASK] == _env("metaworld_pixels").features[TASK]


def test_a_pixel_policy_trains_on_lerobots_metaworld_layout(tmp_path):
    pytest.importorskip("metaworld", reason=NEEDS_METAWORLD)
    from lerobot.checkpoints import load_policy
    from lerobot.cli.train import train_main

    run = tmp_path / "run"
    code = train_main(
        [
            "+experiment=diffusion_metaworld_mt10_image_cpu",
            "env.task=[reach-v3,drawer-close-v3]",  # the fixture's tasks (a run trains on env.task's)
            f"dataset.root={DATASET}",
            f"dataset.cache_dir={tmp_path / 'cache'}",
            "dataset.image_size=[96,96]",
            "policy.down_dims=[16,32]",
            "training.steps=2",
            "training.batch_size=4",
            "training.save_freq=2",
            "eval.freq=0",
            f"output_dir={run}",
        ]
    )
    assert code == 0
    policy = load_policy(run)
    assert policy.config.image_features == {IMAGE: [3, 96, 96]}
    assert policy.task_embedding.num_embeddings == 50
