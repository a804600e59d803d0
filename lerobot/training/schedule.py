"""The update schedule of the online trainer: when to act randomly, and how many gradient updates follow each
collection (SB3 semantics).

Counting (all counts in transitions over all envs unless said otherwise):
- `training.steps`: total env transitions (n_envs per vector step), the x axis of every log.
- `training.train_freq`: vector steps per collection (train_freq * n_envs transitions).
- `training.gradient_steps`: updates after each collection; -1 = as many as transitions just collected.
- `training.utd_ratio` (optional, takes precedence over `gradient_steps` when set): updates per collected
  transition, accumulated with a fractional carry (0.5 with n_envs=1, train_freq=1 gives one update every
  second collection; 2.0 with n_envs=4 gives 8 per collection).
- `training.learning_starts`: random actions for every vector step taken while fewer transitions than this
  have been collected; updates begin after the first collection that ends with more than this many.
- `training.initial_updates`: extra updates made at once after that first collection, on the random data
  alone (TD-MPC makes as many as it took random steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lerobot.errors import ConfigError


@dataclass
class UpdateSchedule:
    """When to act randomly and how many gradient updates follow each collection (pure bookkeeping)."""

    n_envs: int
    train_freq: int = 1
    gradient_steps: int = 1
    learning_starts: int = 0
    utd_ratio: float | None = None
    initial_updates: int = 0
    _carry: float = 0.0

    def __post_init__(self) -> None:
        if self.n_envs < 1 or self.train_freq < 1:
            raise ConfigError(f"n_envs={self.n_envs} and train_freq={self.train_freq} must be >= 1")
        if self.gradient_steps < -1:
            raise ConfigError(
                f"training.gradient_steps={self.gradient_steps}: use >= 0, or -1 for 'as collected'"
            )
        if self.utd_ratio is not None and self.utd_ratio < 0:
            raise ConfigError(f"training.utd_ratio={self.utd_ratio} must be >= 0")
        if self.learning_starts < 0:
            raise ConfigError(f"training.learning_starts={self.learning_starts} must be >= 0")
        if self.initial_updates < 0:
            raise ConfigError(f"training.initial_updates={self.initial_updates} must be >= 0")

    @classmethod
    def from_config(cls, training_cfg: Any) -> UpdateSchedule:
        """The schedule of the `training` config section."""
        return cls(
            n_envs=training_cfg.n_envs,
            train_freq=training_cfg.train_freq,
            gradient_steps=training_cfg.gradient_steps,
            learning_starts=training_cfg.learning_starts,
            utd_ratio=training_cfg.utd_ratio,
            initial_updates=training_cfg.initial_updates,
        )

    @property
    def transitions_per_collection(self) -> int:
        """Transitions one collection adds: `train_freq` vector steps of `n_envs` envs."""
        return self.n_envs * self.train_freq

    def random_actions(self, transitions_so_far: int) -> bool:
        """Whether the vector step about to be taken uses random actions (SB3: num_timesteps < learning_starts)."""
        return transitions_so_far < self.learning_starts

    def updates_after_collection(self, transitions_so_far: int) -> int:
        """Gradient updates to run after a collection that brought the total to `transitions_so_far`."""
        if transitions_so_far <= self.learning_starts:
            return 0
        collected = self.transitions_per_collection
        # The first collection past learning_starts: a stateless test, so a resumed run never repeats it.
        first = self.initial_updates if transitions_so_far - collected <= self.learning_starts else 0
        if self.utd_ratio is not None:
            self._carry += self.utd_ratio * collected
            n = int(self._carry + 1e-9)
            self._carry -= n
            return first + n
        return first + (self.gradient_steps if self.gradient_steps >= 0 else collected)

    def count_updates(self, total_transitions: int, start: int = 0) -> int:
        """Updates a run from `start` to `total_transitions` transitions will make (without changing state)."""
        saved = self._carry
        n, t = 0, start
        while t < total_transitions:
            t += self.transitions_per_collection
            n += self.updates_after_collection(t)
        self._carry = saved
        return n

    def state_dict(self) -> dict[str, float]:
        """The fractional update carry of `utd_ratio`, for checkpoints."""
        return {"carry": self._carry}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore what `state_dict` returned."""
        self._carry = float(state["carry"])
