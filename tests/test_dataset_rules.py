"""PushT keypoints and coverage reward computed from a block pose agree with gym-pusht itself."""

from __future__ import annotations

import gym_pusht  # noqa: F401  (registers the env)
import gymnasium as gym
import numpy as np
import pytest

from lerobot.datasets.pusht_rules import GOAL_POSE, block_coverage, block_keypoints, coverage_reward


def _set_block_pose(env, pose: np.ndarray) -> None:
    """Place the block exactly at `pose` (origin x, y, angle) through its pymunk body.

    Angle first: pymunk rotates a body about its centre of gravity, so setting the angle after the position
    would move the origin. `reset_to_state` does exactly that, which is why it cannot be used here.
    """
    block = env.unwrapped.block
    block.angle = float(pose[2])
    block.position = (float(pose[0]), float(pose[1]))
    assert np.allclose(np.array(block.position), pose[:2]) and block.angle == pose[2]


def _random_poses(n: int, seed: int) -> np.ndarray:
    """Half uniform over the table, half around the goal with noise from tiny to large (successes too)."""
    rng = np.random.default_rng(seed)
    uniform = np.column_stack(
        [rng.uniform(60, 450, n // 2), rng.uniform(60, 450, n // 2), rng.uniform(-7, 7, n // 2)]
    )
    scale = np.geomspace(0.05, 30, n - n // 2)[:, None] * np.array([1.0, 1.0, 0.02])
    near = GOAL_POSE + rng.normal(size=(n - n // 2, 3)) * scale
    return np.concatenate([uniform, near])


def test_keypoints_equal_env_environment_state():
    env = gym.make("gym_pusht/PushT-v0", obs_type="environment_state_agent_pos", disable_env_checker=True)
    env.reset(seed=0)
    poses = _random_poses(200, seed=1)
    expected = []
    for pose in poses:
        _set_block_pose(env, pose)
        expected.append(env.unwrapped.get_obs()["environment_state"])
    env.close()
    ours = block_keypoints(poses)
    assert ours.shape == (200, 16)
    np.testing.assert_allclose(ours, np.array(expected), rtol=0, atol=1e-9)


def test_keypoints_at_goal_pose_by_hand():
    # At angle 0 and origin (100, 50), the bar's corners are the local vertices shifted by the origin.
    kp = block_keypoints(np.array([[100.0, 50.0, 0.0]])).reshape(8, 2)
    np.testing.assert_allclose(kp[:4], [[40, 50], [160, 50], [160, 80], [40, 80]])
    np.testing.assert_allclose(kp[4:], [[85, 80], [115, 80], [115, 170], [85, 170]])


def test_reward_and_success_equal_env_step():
    """Set a pose, step with the agent parked far away, compare with the env's own reward and is_success."""
    env = gym.make("gym_pusht/PushT-v0", obs_type="state", disable_env_checker=True)
    rewards, successes, poses = [], [], []
    for pose in _random_poses(120, seed=2):
        env.reset(seed=0)
        _set_block_pose(env, pose)
        parked = np.array([20.0, 20.0])
        env.unwrapped.agent.position = tuple(parked)
        _, reward, terminated, _, info = env.step(parked)
        rewards.append(reward)
        successes.append(info["is_success"])
        assert terminated == info["is_success"]
        # The env scores the pose after its physics step; read it back rather than assuming it stayed put.
        poses.append(info["block_pose"])
    env.close()
    ours_reward, ours_success = coverage_reward(np.array(poses))
    np.testing.assert_allclose(ours_reward, rewards, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(ours_success, successes)
    # The sample must exercise both outcomes and the clipping at 1.
    assert 5 <= ours_success.sum() <= 115
    assert (ours_reward == 1.0).any() and (ours_reward < 0.5).any()


def test_coverage_matches_env_private_rule_exactly():
    env = gym.make("gym_pusht/PushT-v0", obs_type="state", disable_env_checker=True)
    env.reset(seed=0)
    poses = _random_poses(100, seed=3)
    expected = []
    for pose in poses:
        _set_block_pose(env, pose)
        expected.append(env.unwrapped._get_coverage())
    env.close()
    np.testing.assert_allclose(block_coverage(poses), expected, rtol=0, atol=1e-12)
    assert block_coverage(GOAL_POSE[None])[0] == pytest.approx(1.0)


def test_rules_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        block_keypoints(np.zeros(3))
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        coverage_reward(np.zeros((4, 5)))
