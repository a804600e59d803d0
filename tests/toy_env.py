"""A tiny deterministic env for rollout tests: episodes end at seed-dependent steps.

Observation `observation.state` = (seed, t): already keyed by our batch key, so the raw env (with no
`make_env` wrapper) feeds `observation_to_batch` directly. Reward at step t is `seed + t / 100` (plus
`action_weight * action[1]` when `action_weight` is set, so that every action value shows in the rewards).
The episode terminates at step
`term_at(seed)` (success) or is truncated by the time limit; with `fail_at` the env raises at that step,
with `hang_at` it sleeps for a minute there.
"""

from __future__ import annotations

import multiprocessing
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def term_at(seed: int) -> int:
    """Step at which an episode with this seed terminates; seeds divisible by 3 never do (truncation)."""
    return 10**9 if seed % 3 == 0 else 3 + (seed * 7) % 11


class ToyEnv(gym.Env):
    """Deterministic episodes of seed-dependent length, with `is_success` on termination."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        render_mode: str | None = "rgb_array",
        fail_at: int | None = None,
        hang_at: int | None = None,
        frame_side: int = 8,
        action_weight: float = 0.0,
    ):
        self.observation_space = spaces.Dict({"observation.state": spaces.Box(-1e6, 1e6, (2,), np.float64)})
        self.action_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.render_mode = render_mode
        self.fail_at = fail_at
        self.hang_at = hang_at
        self.frame_side = frame_side
        self.action_weight = action_weight
        self.seed_value = 0
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed_value = int(seed) if seed is not None else -1
        self.t = 0
        return self._obs(), {"is_success": False}

    def _obs(self):
        return {"observation.state": np.array([self.seed_value, self.t], dtype=np.float64)}

    def step(self, action):
        self.t += 1
        if self.fail_at is not None and self.t >= self.fail_at:
            raise RuntimeError(f"toy env failure at step {self.t}")
        if self.hang_at is not None and self.t >= self.hang_at:
            time.sleep(60)
        # The action must echo the observation's seed: a stale queued action from another episode shows up.
        self.last_action_seed = float(np.asarray(action)[0])
        reward = (
            self.seed_value + self.t / 100 + (0.0 if self.last_action_seed == self.seed_value else -1000.0)
        )
        if self.action_weight:
            reward += self.action_weight * float(np.asarray(action)[1])
        terminated = self.t >= term_at(self.seed_value)
        return self._obs(), reward, terminated, False, {"is_success": terminated}

    def render(self):
        frame = np.zeros((self.frame_side, self.frame_side, 3), dtype=np.uint8)
        frame[..., 0] = self.t % 256
        return frame


def make_toy(
    max_episode_steps: int = 12,
    fail_at: int | None = None,
    hang_at: int | None = None,
    worker_start_delay_s: float = 0.0,
    frame_side: int = 8,
    action_weight: float = 0.0,
) -> gym.Env:
    """A time-limited ToyEnv (truncation after `max_episode_steps`) rendering (frame_side, frame_side, 3)
    frames; built in a worker process it first sleeps `worker_start_delay_s` (a stuck start-up).
    `action_weight`: see the module docstring."""
    if multiprocessing.parent_process() is not None:
        time.sleep(worker_start_delay_s)
    return gym.wrappers.TimeLimit(
        ToyEnv(fail_at=fail_at, hang_at=hang_at, frame_side=frame_side, action_weight=action_weight),
        max_episode_steps=max_episode_steps,
    )
