"""`OnlinePolicy`: what a policy that learns from its own experience provides to the online trainer."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from gymnasium import spaces

from lerobot.policies.policy import Policy


class OnlinePolicy(Policy):
    """A `Policy` trained by `lerobot.training.online` from a replay buffer of its own transitions.

    Its `forward` takes a batch of replayed sub-trajectories of `replay_horizon` transitions (the layout of
    `ReplayBuffer.sample`: observations `(B, H+1, ...)`, `action (B, H, A)`, `next.reward`,
    `next.terminated`, `next.truncated`, `next.done` `(B, H)`). Besides that and `predict_action_chunk`, a
    subclass provides:

    - `explore`: a switch the trainer turns on while collecting data and off otherwise; while on,
      `predict_action_chunk` adds exploration noise. Evaluation always runs with it off.
    - `update_target()`: called after every gradient update (e.g. an EMA step of a target network).
    - `set_noise_seed(seed)`: seeds the policy's own action noise, so data collection is reproducible.

    It may also override `set_progress(transitions)`, which the trainer calls before every vector step it
    collects, for settings that follow training (TD-MPC's warm-up schedules), and set `reports_priorities`
    when its `forward` weighs its losses by the batch's `sample_weight` (B,) and returns `sample_priority`
    (B,), which prioritised replay (`training.per_alpha > 0`) needs.
    """

    reports_priorities: bool = False

    def __init__(
        self, *, n_obs_steps: int, n_action_steps: int, temporal_ensemble_coeff: float | None = None
    ):
        super().__init__(
            n_obs_steps=n_obs_steps,
            n_action_steps=n_action_steps,
            temporal_ensemble_coeff=temporal_ensemble_coeff,
        )
        self.explore = False

    @property
    @abc.abstractmethod
    def replay_horizon(self) -> int:
        """Transitions per replayed sample: the H of the `(B, H+1, ...)` observations `forward` expects."""

    @abc.abstractmethod
    def update_target(self) -> None:
        """Move whatever trails the trained weights (e.g. a target network) one step after an update."""

    @abc.abstractmethod
    def set_noise_seed(self, seed: int | Sequence[int]) -> None:
        """Seed the action noise: an int gives env slot b `seed + b`; a sequence gives one seed per slot."""

    def check_run(self, training_cfg: Any, action_space: spaces.Space | None = None) -> None:
        """Refuse, in one line (`ConfigError`), a run this learner cannot train: its `training` section
        (`training_cfg`) or the train envs' single action space. The online trainer calls it at start-up,
        before the first transition; nothing is refused by default."""

    def set_progress(self, transitions: int) -> None:
        """Told the transitions collected so far (all envs), before each collection step; nothing by default."""
