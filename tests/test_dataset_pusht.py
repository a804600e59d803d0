"""The real PushT demonstrations (`pusht_data_root` fixture): counts, shapes, features, windows, statistics.

The conversion goes to the session's temporary cache (conftest points `$XDG_CACHE_HOME` there, never at the
user's `~/.cache/lerobot`), so it runs once per test session.
"""

from __future__ import annotations

import time
from pathlib import Path

import gym_pusht  # noqa: F401  (registers the env)
import gymnasium as gym
import numpy as np
import pytest
import torch
import zarr
from omegaconf import OmegaConf

from lerobot.config import DatasetConfig, EnvConfig
from lerobot.datasets import EpisodeDataset, make_dataloader, make_dataset
from lerobot.datasets.pusht_import import prepare_pusht
from lerobot.datasets.pusht_rules import block_keypoints

REPO_ROOT = Path(__file__).resolve().parents[1]
ZARR = "pusht_cchi_v7_replay.zarr"
DP_DELTA = {
    "observation.image": [-0.1, 0.0],
    "observation.state": [-0.1, 0.0],
    "action": [round(0.1 * k, 1) for k in range(-1, 15)],
}


@pytest.fixture(scope="session")
def pusht_root(pusht_data_root) -> Path:
    t0 = time.perf_counter()
    root = prepare_pusht(DatasetConfig(root=str(pusht_data_root)), download=False)
    print(f"prepare_pusht: {time.perf_counter() - t0:.1f} s")
    return root


@pytest.fixture(scope="session")
def source(pusht_data_root):
    return zarr.open_group(str(pusht_data_root / ZARR), mode="r")


def _env_cfg(name: str) -> EnvConfig:
    merged = OmegaConf.merge(
        OmegaConf.structured(EnvConfig), OmegaConf.load(REPO_ROOT / "configs" / "env" / f"{name}.yaml")
    )
    return OmegaConf.to_object(merged)


def test_counts_and_shapes(pusht_root):
    ds = EpisodeDataset(pusht_root)
    assert ds.num_episodes == 206 and ds.num_frames == 25650 and ds.fps == 10
    assert ds.features == {
        "observation.state": (2,),
        "observation.environment_state": (16,),
        "action": (2,),
        "next.reward": (),
        "next.success": (),
        "next.done": (),
        "observation.image": (3, 96, 96),
    }
    item = ds[0]
    assert item["observation.image"].shape == (3, 96, 96) and item["observation.image"].dtype == torch.float32
    assert item["observation.image"].min() >= 0.0 and item["observation.image"].max() <= 1.0
    assert ds.meta["episode_ends"][:3] == [161, 279, 420]
    done = np.load(pusht_root / "next.done.npy")
    assert done.sum() == 206 and done[160] and done[-1]


def test_features_match_source(pusht_root, source):
    ds = EpisodeDataset(pusht_root)
    state = source["data/state"][:]
    rows = np.array([0, 1, 160, 161, 12345, 25649])
    batch = ds.__getitems__(rows)
    np.testing.assert_allclose(batch["observation.state"].numpy(), state[rows, :2])
    np.testing.assert_allclose(batch["action"].numpy(), source["data/action"][:][rows])
    keypoints = block_keypoints(state[rows, 2:5].astype(np.float64))
    np.testing.assert_allclose(batch["observation.environment_state"].numpy(), keypoints, rtol=1e-6)
    for row, frame in zip(rows[:3], batch["observation.image"][:3]):
        expected = source["data/img"][int(row)].transpose(2, 0, 1) / 255.0
        np.testing.assert_allclose(frame.numpy(), expected, atol=1e-6)


def test_recorded_pose_convention_reproduces_recorded_images(source):
    """Rendering the env with the block at the recorded (origin, angle) reproduces the recorded image.

    This pins the pose convention the keypoints and rewards are derived from; placing the block the way
    `reset_to_state` does (position, then angle about the centre of gravity) misses by several pixels.
    """
    env = gym.make("gym_pusht/PushT-v0", obs_type="pixels", disable_env_checker=True)
    env.reset(seed=0)
    u = env.unwrapped
    for row in (0, 5000, 25649):
        s = source["data/state"][row].astype(np.float64)
        u.agent.position = tuple(s[:2])
        u.block.angle = s[4]
        u.block.position = tuple(s[2:4])
        for body in (u.agent, u.block):
            u.space.reindex_shapes_for_body(body)  # refresh the shapes' cached world geometry for drawing
        diff = np.abs(u._render().astype(np.float64) - source["data/img"][row]).mean()
        assert diff < 0.5, f"frame {row}: mean abs pixel difference {diff:.2f}"
    env.close()


def test_diffusion_policy_windows(pusht_root):
    ds = EpisodeDataset(pusht_root, delta_timestamps=DP_DELTA, keys=list(DP_DELTA))
    batch = ds.__getitems__([0, 150, 160, 161])
    assert batch["observation.image"].shape == (4, 2, 3, 96, 96)
    assert batch["observation.state"].shape == (4, 2, 2) and batch["action"].shape == (4, 16, 2)
    assert batch["observation.image_is_pad"].tolist() == [
        [True, False],
        [False, False],
        [False, False],
        [True, False],
    ]
    # Episode 0 has frames 0..160: from frame 150 the offsets +1.1..+1.4 s (frames 161..164) are past its end.
    assert batch["action_is_pad"][1].tolist() == [False] * 12 + [True] * 4
    assert batch["action_is_pad"][2].tolist() == [False, False] + [True] * 14
    torch.testing.assert_close(batch["action"][2, 2:], batch["action"][2, 1].expand(14, 2))


def test_stats_from_training_split(pusht_root):
    env = _env_cfg("pusht")
    train = EpisodeDataset(pusht_root, episodes=range(0, 185), keys=list(env.features))
    full = EpisodeDataset(pusht_root, keys=list(env.features))
    stats = train.stats
    assert stats["observation.image"]["mean"].shape == (3, 1, 1)
    assert torch.all((stats["observation.image"]["mean"] > 0.5) & (stats["observation.image"]["mean"] < 1.0))
    assert torch.all(stats["observation.image"]["std"] > 0.05)
    assert torch.all(stats["action"]["min"] >= 0) and torch.all(stats["action"]["max"] <= 512)
    assert not torch.equal(stats["action"]["mean"], full.stats["action"]["mean"])
    actions = np.load(pusht_root / "action.npy")[: train.num_frames].astype(np.float64)
    np.testing.assert_allclose(stats["action"]["mean"].numpy(), actions.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["action"]["std"].numpy(), actions.std(0), rtol=1e-6)


@pytest.mark.parametrize("env_name", ["pusht", "pusht_keypoints"])
def test_make_dataset_for_env_configs(pusht_data_root, pusht_root, env_name):
    env = _env_cfg(env_name)
    cfg = DatasetConfig(root=str(pusht_data_root), val_fraction=0.1, split_seed=0)
    train = make_dataset(cfg, env, DP_DELTA if env_name == "pusht" else None)
    val = make_dataset(cfg, env, None, split="val")
    assert train.num_episodes == 185 and val.num_episodes == 21
    assert train.num_frames + val.num_frames == 25650
    assert set(train.features) == set(env.features)
    loader = make_dataloader(train, 64, seed=0, num_steps=2)
    batch = next(iter(loader))
    for key, feature in env.features.items():
        window = 2 if env_name == "pusht" and key != "action" else (16 if env_name == "pusht" else None)
        expected = (64, *(() if window is None else (window,)), *feature.shape)
        assert tuple(batch[key].shape) == expected, key
