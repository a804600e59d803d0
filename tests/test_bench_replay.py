"""The evaluation benchmark's ceiling replays exactly the episodes the evaluation ran."""

import sys
from pathlib import Path

import gymnasium as gym
from gymnasium.vector import SyncVectorEnv
from test_rollout import EchoSeedPolicy
from toy_env import make_toy

from lerobot.rollout import eval_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_envs import RecordingVectorEnv, replay_steps_per_s  # noqa: E402


class _Rewards(gym.vector.VectorWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.rewards = []

    def step(self, actions):
        out = self.env.step(actions)
        self.rewards.append(out[1].copy())
        return out


def test_replay_remakes_the_evaluated_episodes():
    # The toy env's reward encodes the episode's seed, its step and whether the action echoed the seed, so
    # equal reward sequences mean the same episodes, stepped with the same actions, reset at the same steps.
    original = _Rewards(SyncVectorEnv([make_toy] * 3))
    recorder = RecordingVectorEnv(original)
    eval_policy(recorder, EchoSeedPolicy(), 7, start_seed=10, progress=False)
    n_steps = sum(kind == "step" for kind, _, _ in recorder.calls)
    assert sum(kind == "reset" for kind, _, _ in recorder.calls) > 2  # per-slot resets were recorded

    for _ in range(2):  # twice: the recorded options (gymnasium pops `reset_mask`) survive a replay
        replayed = _Rewards(SyncVectorEnv([make_toy] * 3))
        assert replay_steps_per_s(replayed, recorder.calls) > 0
        assert len(replayed.rewards) == n_steps == len(original.rewards)
        for got, want in zip(replayed.rewards, original.rewards):
            assert (got == want).all()
