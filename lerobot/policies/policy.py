"""The `Policy` base class: observation history and action-chunk queue, shared by every policy.

Subclasses implement only `predict_action_chunk` (inference) and `forward` (training loss). Everything that
turns chunks into one action per env step lives here, once.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np
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
    can start a new episode in one slot while the others keep their queued actions. When only some envs
    need a new chunk, `predict_action_chunk` gets just their rows, and `self.chunk_env_ids` (LongTensor,
    or None for all envs) says which env slots those rows are, for policies with per-env state.
    """

    def __init__(self, *, n_obs_steps: int, n_action_steps: int):
        super().__init__()
        if n_obs_steps < 1 or n_action_steps < 1:
            raise ValueError(f"n_obs_steps={n_obs_steps} and n_action_steps={n_action_steps} must be >= 1")
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.chunk_env_ids: Tensor | None = None
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
    def reset(self, env_ids: Sequence[int] | Tensor | np.ndarray | None = None) -> None:
        """Clear observation history and action queue, for all envs (`None`) or only for `env_ids`."""
        if env_ids is None:
            self._history: dict[str, Tensor] | None = None  # key -> (B, n_obs_steps, ...)
            self._queue: Tensor | None = None  # (B, n_action_steps, action_dim)
            # Bookkeeping stays in numpy: checking it costs no tensor op (and no device sync) per step.
            self._queue_pos = np.zeros(0, dtype=np.int64)  # (B,) next action index; n_action_steps = empty
            self._fresh = np.zeros(0, dtype=bool)  # (B,) the next observation fills the whole history
            self.on_reset(None)
            return
        if self._history is None:
            return
        ids = np.asarray(env_ids.cpu() if isinstance(env_ids, Tensor) else env_ids, dtype=np.int64)
        self._queue_pos[ids] = self.n_action_steps
        self._fresh[ids] = True
        self.on_reset(torch.from_numpy(ids))

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """Return one action per env (B, action_dim) for the current observations (B, ...)."""
        obs = {k: v for k, v in batch.items() if k.startswith(OBS_PREFIX)}
        if not obs:
            raise KeyError(
                f"select_action needs observation keys (starting with {OBS_PREFIX!r}), got {list(batch)}"
            )
        first = next(iter(obs.values()))
        batch_size = first.shape[0]
        if self._history is None or self._fresh.shape[0] != batch_size or self._history.keys() != obs.keys():
            self._history = {
                k: v.unsqueeze(1).expand(-1, self.n_obs_steps, *v.shape[1:]) for k, v in obs.items()
            }
            self._fresh = np.zeros(batch_size, dtype=bool)
            self._queue_pos = np.full(batch_size, self.n_action_steps, dtype=np.int64)
            self._queue = None
        else:
            fresh_ids = np.flatnonzero(self._fresh) if self.n_obs_steps > 1 and self._fresh.any() else None
            for key, value in obs.items():
                if self.n_obs_steps == 1:
                    self._history[key] = value.unsqueeze(1)
                    continue
                rolled = torch.cat([self._history[key][:, 1:], value.unsqueeze(1)], dim=1)
                if fresh_ids is not None:
                    ids = torch.from_numpy(fresh_ids).to(value.device)
                    rolled[ids] = value[ids].unsqueeze(1)
                self._history[key] = rolled
            if fresh_ids is not None or self.n_obs_steps == 1:
                self._fresh[:] = False

        empty = self._queue_pos >= self.n_action_steps
        if empty.all():
            self._fill_queue(self._history, None)
        elif empty.any():
            index = torch.from_numpy(np.flatnonzero(empty)).to(first.device)
            self._fill_queue({k: v[index] for k, v in self._history.items()}, index)
        pos = self._queue_pos
        if pos.min() == pos.max():
            action = self._queue[:, int(pos[0])]
        else:
            rows = torch.arange(batch_size, device=self._queue.device)
            action = self._queue[rows, torch.from_numpy(pos).to(self._queue.device)]
        self._queue_pos += 1
        return action

    def _fill_queue(self, history: dict[str, Tensor], ids: Tensor | None) -> None:
        """Predict chunks for the envs `ids` (LongTensor, all envs when None) and queue them."""
        self.chunk_env_ids = ids
        try:
            chunk = self.predict_action_chunk(dict(history))
        finally:
            self.chunk_env_ids = None
        n_envs = next(iter(history.values())).shape[0]
        if chunk.ndim != 3 or chunk.shape[0] != n_envs or chunk.shape[1] < self.n_action_steps:
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={n_envs}, T>={self.n_action_steps}, action_dim)"
            )
        chunk = chunk[:, : self.n_action_steps]
        if ids is None:
            self._queue = chunk
            self._queue_pos[:] = 0
            return
        if self._queue is None:
            self._queue = chunk.new_zeros(self._queue_pos.shape[0], *chunk.shape[1:])
        elif self._queue.data_ptr() == chunk.data_ptr() or not self._queue.is_contiguous():
            self._queue = self._queue.clone()
        self._queue[ids] = chunk
        self._queue_pos[ids.cpu().numpy()] = 0
