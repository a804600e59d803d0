"""`eval.record_dataset`: evaluated episodes written as a LeRobotDataset v3.0, read back as training data."""

import json

import numpy as np
import pytest
import torch
from test_train import TINY, metrics

from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import DatasetConfig, env_config
from lerobot.datasets.factory import dataset_format
from lerobot.datasets.format import read_meta
from lerobot.datasets.lerobot_format import open_lerobot_dataset
from lerobot.datasets.lerobot_import import convert_lerobot_dataset
from lerobot.policy_registry import make_policy, make_policy_config

COMMON = [
    "eval.n_episodes=3",
    "eval.batch_size=2",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=0",
]


def _record(tmp_path, *args: str):
    out, record = tmp_path / "eval", tmp_path / "rollouts"
    assert eval_main([*COMMON, *args, f"eval.record_dataset={record}", "--output-dir", str(out)]) == 0
    info = json.loads((out / "eval_info.json").read_text())
    converted = convert_lerobot_dataset(record, tmp_path / "converted" / "v1")
    return info, record, converted


def _episodes(converted):
    meta = read_meta(converted)
    ends = np.asarray(meta["episode_ends"])
    starts = np.concatenate([[0], ends[:-1]])
    arrays = {key: np.load(converted / f"{key}.npy") for key in meta["features"]}
    return meta, [{k: v[s:e] for k, v in arrays.items()} for s, e in zip(starts, ends)]


@pytest.mark.parametrize("policy", ["pusht_scripted", "random"])
def test_recorded_keypoint_episodes_hold_what_eval_info_reports(tmp_path, policy):
    """Per step: the observation acted on, the action, the reward, success and done flags, the seed."""
    info, record, converted = _record(
        tmp_path, f"policy={policy}", "env=pusht_keypoints", "env.max_episode_steps=25"
    )
    assert open_lerobot_dataset(record).version == "v3.0"
    meta, episodes = _episodes(converted)
    assert meta["num_episodes"] == 3 and meta["fps"] == 10
    for row, episode in zip(info["per_episode"], episodes):
        assert len(episode["action"]) == row["n_steps"]
        assert set(episode["episode.seed"].tolist()) == {row["seed"]}
        rewards = episode["next.reward"].astype(np.float64)
        assert rewards.sum() == pytest.approx(row["sum_reward"], rel=1e-6, abs=1e-6)
        assert rewards.max() == pytest.approx(row["max_reward"], rel=1e-6, abs=1e-7)
        assert bool(episode["next.success"].any()) == row["success"]
        assert episode["next.done"].tolist() == [False] * (row["n_steps"] - 1) + [True]
        assert episode["observation.environment_state"].shape == (row["n_steps"], 16)
        assert episode["observation.state"].shape == (row["n_steps"], 2)
        # The env moved: consecutive observations differ, and the recorded actions are the policy's.
        assert np.abs(np.diff(episode["observation.state"], axis=0)).max() > 0
        assert np.all((episode["action"] >= 0) & (episode["action"] <= 512))
    if policy == "pusht_scripted":  # row t's action is what the policy does given row t's observation
        acting = make_policy(
            make_policy_config(
                {"name": "pusht_scripted"}, env_config(compose_config(["env=pusht_keypoints"]))
            )
        )
        for episode in episodes:
            acting.reset()
            for t in range(len(episode["action"])):
                obs = {
                    k: torch.from_numpy(episode[k][t : t + 1])
                    for k in ("observation.state", "observation.environment_state")
                }
                np.testing.assert_allclose(
                    acting.select_action(obs)[0].numpy(), episode["action"][t], rtol=1e-6
                )


def test_recorded_camera_episodes_are_videos_and_train_as_a_dataset(tmp_path):
    info, record, converted = _record(tmp_path, "policy=random", "env=pusht", "env.max_episode_steps=12")
    source = open_lerobot_dataset(record)
    assert source.video_keys == ["observation.image"]
    meta, episodes = _episodes(converted)
    assert meta["features"]["observation.image"]["shape"] == [3, 96, 96]
    assert [len(e["action"]) for e in episodes] == [r["n_steps"] for r in info["per_episode"]]
    frames = episodes[0]["observation.image"]
    assert frames.dtype == np.uint8 and frames.std() > 10  # rendered scenes, not blank frames
    # As training data: `dataset.repo_id=... dataset.root=<it>`.
    assert dataset_format(DatasetConfig(repo_id="local/rollouts", root=str(record))) == "lerobot"


def test_a_policy_trains_on_recorded_rollouts(tmp_path):
    _, record, _ = _record(
        tmp_path, "policy=pusht_scripted", "env=pusht_keypoints", "env.max_episode_steps=20"
    )
    run = tmp_path / "run"
    args = [*TINY, "env=pusht_keypoints", "training.steps=2", "eval.freq=0", f"output_dir={run}"]
    data = ["dataset.repo_id=local/rollouts", f"dataset.root={record}", f"dataset.cache_dir={tmp_path / 'c'}"]
    assert train_main([*args, *data]) == 0
    assert [r["step"] for r in metrics(run)] == [1, 2]


def test_an_existing_record_directory_is_one_line_before_any_episode(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    args = [*COMMON, "policy=random", "env=pusht_keypoints", f"eval.record_dataset={tmp_path / 'taken'}"]
    assert eval_main([*args, "--output-dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert "eval.record_dataset" in err and "already exists" in err
    assert not (tmp_path / "eval" / "eval_info.json").exists()


def test_training_refuses_to_record(tmp_path, capsys):
    args = [
        *TINY,
        "env=pusht_keypoints",
        f"eval.record_dataset={tmp_path / 'r'}",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert train_main(args) == 2
    assert "scripts/eval.py --checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
