"""A toy gymnasium env with a nested camera dict, as gym-aloha has: registered on import.

Observation: `{"pixels": {"top": (12, 16, 3) uint8}, "state": (2,) float64}`. An episode with seed `s` shows
an image filled with `level(s) * 50` and the state `(level(s), t)`. The reward is 1 when the action is
`(image brightness in [0, 1], level)`, else 0, so a policy that reads both inputs through the right batch
keys (and the right scaling) earns exactly 1 per step. Episodes terminate with success at `term_at(s)`.

`make_env` imports this module in every worker (its gym id's namespace), which registers the env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

GYM_ID = "nested_pixels_env/NestedPixels-v0"
HEIGHT, WIDTH = 12, 16  # not square, so a swapped H/W shows up


def level(seed: int) -> int:
    """The episode's brightness level, 0..4."""
    return seed % 5


def term_at(seed: int) -> int:
    """Step at which an episode with this seed terminates (with success)."""
    return 3 + seed % 3


class NestedPixelsEnv(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None):
        self.observation_space = spaces.Dict(
            {
                "pixels": spaces.Dict({"top": spaces.Box(0, 255, (HEIGHT, WIDTH, 3), np.uint8)}),
                "state": spaces.Box(-1e6, 1e6, (2,), np.float64),
            }
        )
        self.action_space = spaces.Box(np.float32([0.0, 0.0]), np.float32([1.0, 10.0]), dtype=np.float32)
        self.render_mode = render_mode
        self.seed_value = 0
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed_value = int(seed) if seed is not None else 0
        self.t = 0
        return self._obs(), {"is_success": False}

    def _obs(self) -> dict:
        image = np.full((HEIGHT, WIDTH, 3), level(self.seed_value) * 50, dtype=np.uint8)
        return {
            "pixels": {"top": image},
            "state": np.array([level(self.seed_value), self.t], dtype=np.float64),
        }

    def step(self, action):
        self.t += 1
        brightness = level(self.seed_value) * 50 / 255
        hit = abs(float(action[0]) - brightness) < 1e-5 and float(action[1]) == level(self.seed_value)
        terminated = self.t >= term_at(self.seed_value)
        return self._obs(), float(hit), terminated, False, {"is_success": terminated}

    def render(self):
        return self._obs()["pixels"]["top"]


if GYM_ID not in gym.registry:
    gym.register(GYM_ID, entry_point=NestedPixelsEnv)
