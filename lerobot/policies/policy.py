"""The `Policy` base class: observation history and action-chunk queue, shared by every policy.

Subclasses implement only `predict_action_chunk` (inference) and `forward` (training loss). Everything that
turns chunks into one action per env step lives here, once.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lerobot.constants import OBS_PREFIX


class Policy(nn.Module, abc.ABC):
    """Base class for policies that act from a short observation history by predicting action chunks.

    `select_action` keeps, for every env of the batch, the last `n_obs_steps` observations and a queue of
    at most `n_action_steps` actions. When an env's queue is empty it asks `predict_action_chunk` for a new
    chunk from the stacked history and queues its first `n_action_steps` actions.

    Timing, with `n_obs_steps=2` and `n_action_steps=3` (t = env step at which `select_action` is called):

        | t | history passed to predict_action_chunk | action returned      |
        |---|----------------------------------------|----------------------|
        | 0 | (o0, o0)  (the first obs fills it)     | chunk0[0]            |
        | 1 | -                                      | chunk0[1]            |
        | 2 | -                                      | chunk0[2]            |
        | 3 | (o2, o3)                               | chunk3[0]            |
        | 4 | -                                      | chunk3[1]            |

    So `chunk[j]` of a chunk predicted at step t is executed at step t + j, and the chunk is conditioned on
    observations t - n_obs_steps + 1 .. t. Policies whose training targets start earlier (Diffusion Policy's
    horizon starts at the first observation step) return the chunk already sliced so that index 0 is "now".

    Per-env reset: `reset(env_ids)` clears the history and queue of those envs only, so an evaluation loop
    can start a new episode in one slot while the others keep their queued actions.
    """

    def __init__(self, *, n_obs_steps: int, n_action_steps: int):
        super().__init__()
        if n_obs_steps < 1 or n_action_steps < 1:
            raise ValueError(f"n_obs_steps={n_obs_steps} and n_action_steps={n_action_steps} must be >= 1")
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.reset()

    # ----------------------------------------------------------------- to implement
    @abc.abstractmethod
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Return actions (B, T, action_dim), T >= n_action_steps, from observations (B, n_obs_steps, ...)."""

    @abc.abstractmethod
    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Training step: return a dict with a scalar `loss` and any other figures to log."""

    def on_reset(self, env_ids: Tensor | None) -> None:  # noqa: B027 - optional hook, empty by design
        """Hook for per-env state of a subclass (e.g. a planner's previous plan); `None` means all envs."""

    # ----------------------------------------------------------------- shared logic
    def reset(self, env_ids: Sequence[int] | Tensor | None = None) -> None:
        """Clear observation history and action queue, for all envs (`None`) or only for `env_ids`."""
        if env_ids is None:
            self._history: dict[str, Tensor] | None = None
            self._queue: Tensor | None = None  # (B, n_action_steps, action_dim)
            self._queue_pos: Tensor | None = None  # (B,) index of the next action; n_action_steps = empty
            self._fresh: Tensor | None = None  # (B,) bool: next observation fills the whole history
            self.on_reset(None)
            return
        if self._history is None:
            return
        ids = torch.as_tensor(env_ids, dtype=torch.long, device=self._queue_pos.device)
        self._queue_pos[ids] = self.n_action_steps
        self._fresh[ids] = True
        self.on_reset(ids)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Return one action per env (B, action_dim) for the current observations (B, ...)."""
        obs = {k: v for k, v in batch.items() if k.startswith(OBS_PREFIX)}
        if not obs:
            raise KeyError(
                f"select_action needs observation keys (starting with {OBS_PREFIX!r}), got {list(batch)}"
            )
        batch_size = next(iter(obs.values())).shape[0]
        device = next(iter(obs.values())).device
        if self._history is None or self._fresh.shape[0] != batch_size or set(self._history) != set(obs):
            self._history = {
                k: v.unsqueeze(1).repeat_interleave(self.n_obs_steps, dim=1) for k, v in obs.items()
            }
            self._fresh = torch.zeros(batch_size, dtype=torch.bool, device=device)
            self._queue_pos = torch.full((batch_size,), self.n_action_steps, dtype=torch.long, device=device)
            self._queue = None
        else:
            fresh = self._fresh
            for key, value in obs.items():
                rolled = torch.cat([self._history[key][:, 1:], value.unsqueeze(1)], dim=1)
                if fresh.any():
                    filled = value.unsqueeze(1).expand_as(rolled)
                    mask = fresh.view(-1, *([1] * (rolled.ndim - 1)))
                    rolled = torch.where(mask, filled, rolled)
                self._history[key] = rolled
            self._fresh = torch.zeros_like(fresh)

        empty = self._queue_pos >= self.n_action_steps
        if empty.all():
            self._fill_queue(self._history, None)
        elif empty.any():
            ids = empty.nonzero().squeeze(1)
            self._fill_queue({k: v[ids] for k, v in self._history.items()}, ids)
        action = self._queue[torch.arange(batch_size, device=device), self._queue_pos]
        self._queue_pos += 1
        return action

    def _fill_queue(self, history: dict[str, Tensor], ids: Tensor | None) -> None:
        chunk = self.predict_action_chunk(dict(history))
        n_envs = next(iter(history.values())).shape[0]
        if chunk.ndim != 3 or chunk.shape[0] != n_envs or chunk.shape[1] < self.n_action_steps:
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={n_envs}, T>={self.n_action_steps}, action_dim)"
            )
        chunk = chunk[:, : self.n_action_steps]
        if ids is None:
            self._queue = chunk.clone()
            self._queue_pos.zero_()
        else:
            if self._queue is None:
                batch_size = self._queue_pos.shape[0]
                self._queue = chunk.new_zeros(batch_size, *chunk.shape[1:])
            self._queue[ids] = chunk
            self._queue_pos[ids] = 0
