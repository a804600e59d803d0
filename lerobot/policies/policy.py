"""The `Policy` base class: observation history and action-chunk queue, shared by every policy.

A subclass implements `predict_action_chunk` (acting) and `forward` (training loss); everything that turns
chunks into one action per env step lives here, once: `Policy` holds the per-env acting state, whose rules
are in `lerobot.policies.acting`.

A policy knows nothing of files: `lerobot.checkpoints.from_pretrained` and `save_pretrained` load and save
any policy (the registry builds it by name).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from lerobot.policies.acting import ActingState, episode_stream

__all__ = ["Policy", "acting_settings", "episode_stream"]  # `episode_stream` is imported from here too

if TYPE_CHECKING:
    from lerobot.config import PolicyConfig


def acting_settings(config: PolicyConfig) -> dict[str, Any]:
    """The acting settings of a policy's `config` that `Policy.__init__` takes: `n_obs_steps`, `n_action_steps`
    and `temporal_ensemble_coeff`."""
    return {
        "n_obs_steps": config.n_obs_steps,
        "n_action_steps": config.n_action_steps,
        "temporal_ensemble_coeff": config.temporal_ensemble_coeff,
    }


class Policy(nn.Module, abc.ABC):
    """A policy that acts from its last `n_obs_steps` observations by predicting chunks of actions.

    For every env of the batch, `select_action` keeps the last `n_obs_steps` observations and a queue of
    `n_action_steps` actions. An env whose queue is empty gets a new chunk from `predict_action_chunk`,
    given the stacked history of just the envs that need one.

    Timing, with `n_obs_steps=2` and `n_action_steps=3` (t = env step at which `select_action` is called):

        | t | history passed to predict_action_chunk | action returned      |
        |---|----------------------------------------|----------------------|
        | 0 | (o0, o0)  (the first obs fills it)     | chunk0[0]            |
        | 1 | -                                      | chunk0[1]            |
        | 2 | -                                      | chunk0[2]            |
        | 3 | (o2, o3)                               | chunk3[0]            |
        | 4 | -                                      | chunk3[1]            |

    So `chunk[j]` of a chunk predicted at step t is executed at step t + j. Policies whose training targets
    start earlier (Diffusion Policy's horizon starts at the first observation step) return the chunk
    already sliced so that index 0 is "now".

    `reset(env_ids)` clears the history and queue of those envs only, so an evaluation loop can start a new
    episode in one slot while the others keep their queued actions.

    Temporal ensembling (ACT, Zhao et al. 2023), when `temporal_ensemble_coeff` is set (`n_action_steps`
    must then be 1): every env predicts a whole chunk at every step and the action executed at step t is
    the weighted mean of all the predictions made for step t since the env's last reset, with weight
    `exp(-m * i)` for the i-th oldest of them (`m = temporal_ensemble_coeff`; 0 is a plain mean, larger
    values trust older predictions more). The mean is updated online, per env slot, with LeRobot's
    `ACTTemporalEnsembler` arithmetic (see `lerobot.policies.acting.TemporalEnsemble`).

    Episode streams: `reset(env_ids, episode_seeds=...)` gives each of those slots a random stream of its
    own, a `torch.Generator` seeded from the episode's seed alone (`episode_stream`). A policy that draws
    while acting takes its draws from `noise_generators()` (one generator per row of the chunk batch), so
    the k-th draw of an episode is the same whichever slot runs it, whichever episodes share its batch and
    however many processes evaluate: an episode's actions depend on its own observations and seed only.
    Without episode seeds (a caller of `select_action` that gives none), `noise_generators()` is None and
    the policy draws from the global stream.

    To implement: `predict_action_chunk` and `forward`. Optional: `on_reset` for per-env state of the
    subclass (read `chunk_env_ids` in `predict_action_chunk` to know which env slots its rows are), and
    `optimizer_param_groups` for per-group optimizer settings.
    """

    def __init__(
        self, *, n_obs_steps: int, n_action_steps: int, temporal_ensemble_coeff: float | None = None
    ):
        super().__init__()
        # Checks the settings. They are set once: the acting state keeps its own copy.
        self._acting = ActingState(n_obs_steps, n_action_steps, temporal_ensemble_coeff)
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.temporal_ensemble_coeff = temporal_ensemble_coeff
        self.reset()

    # ----------------------------------------------------------------- to implement
    @abc.abstractmethod
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Return actions (B, T, action_dim), T >= n_action_steps, from observations (B, n_obs_steps, ...).

        Runs in the caller's grad mode: a policy with networks decorates it with `@torch.no_grad()`.
        """

    @abc.abstractmethod
    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Training step: return a dict with a scalar `loss` and any other figures to log."""

    def draw_training_noise(self, n: int) -> dict[str, Tensor]:
        """The per-sample random draws of a training `forward` on `n` samples (noise in the broad sense:
        e.g. diffusion noise, timesteps, crop offsets), from the global torch random stream.

        Each value is `(n, ...)`, row i for sample i, and its key starts with
        `lerobot.constants.TRAINING_NOISE_PREFIX`; `forward` reads them from its batch when they are there
        and draws them itself with this method otherwise. The trainer draws them for the whole global batch
        on every process and gives each its rows, so a sample gets the same draws on any number of
        processes. By default a policy has none (`{}`).
        """
        return {}

    def on_reset(self, env_ids: Tensor | None) -> None:  # noqa: B027 - optional hook, empty by design
        """Hook for per-env state of a subclass (e.g. a planner's previous plan); `None` means all envs."""

    def optimizer_param_groups(self) -> list[dict]:
        """Parameter groups for the optimizer; by default one group of every trainable parameter."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    # ----------------------------------------------------------------- acting (rules: `ActingState`)
    @property
    def chunk_env_ids(self) -> Tensor | None:
        """During `predict_action_chunk`: the env slots (LongTensor) its batch rows are; None for all envs."""
        return self._acting.chunk_env_ids

    def reset(
        self,
        env_ids: Sequence[int] | Tensor | np.ndarray | None = None,
        episode_seeds: Sequence[int] | None = None,
    ) -> None:
        """Clear observation history and action queue, for all envs (`None`) or only for `env_ids`.

        `episode_seeds`, one per slot of `env_ids` (of slots 0, 1, ... when `env_ids` is None): the seeds of
        the episodes these slots begin; each slot then draws from its episode's stream (see the class
        docstring). A full reset without them forgets every stream."""
        self._acting.reset(self, env_ids, episode_seeds)

    def noise_generators(self) -> list[torch.Generator] | None:
        """During `predict_action_chunk` called by `select_action`: one CPU generator per row of its batch,
        the stream of the episode that row's env slot runs (draw from them in a fixed order, row by row,
        e.g. with diffusers' `randn_tensor`); None when some row's slot has none, or outside a
        `select_action`: draw from the global stream then."""
        return self._acting.noise_generators()

    def steps_until_chunk(self) -> int:
        """How many `select_action` calls only pop queued actions before one predicts a chunk (0: the next).

        Always 0 under temporal ensembling, which predicts at every step."""
        return self._acting.steps_until_chunk()

    def select_action(self, batch: dict[str, Tensor] | None) -> Tensor:
        """One action per env, (B, action_dim) float32 on the CPU, for the current observations (B, ...).

        Actions go to envs, which live on the host: a chunk is copied from the policy's device once, when
        it is queued, and each step's action is read from that copy. `batch` may be None at a step that
        predicts no chunk (`steps_until_chunk() > 0`) of a policy that keeps no history (`n_obs_steps ==
        1`): nothing would read it, so a caller can skip converting it. A chunk with a NaN or infinite
        action raises `NonFiniteActionError` (its `slot`, `steps_ahead` and `action` say where) when it is
        predicted, before any of its actions is returned.
        """
        return torch.from_numpy(self.select_action_numpy(batch))

    def select_action_numpy(self, batch: dict[str, Tensor] | None) -> np.ndarray:
        """`select_action` as the host array an env takes, (B, action_dim) float32: the rollout's call.

        Between chunks a step only reads the queue; a torch call there would cost more than the read
        (the env step in between leaves the caches cold, so each costs microseconds).
        """
        return self._acting.act(self, batch)
