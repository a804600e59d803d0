"""The `Policy` base class: observation history and action-chunk queue, shared by every policy.

Subclasses implement only `predict_action_chunk` (inference) and `forward` (training loss). Everything that
turns chunks into one action per env step lives here, once.
"""

from __future__ import annotations

import abc
from collections import deque
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

    Cost per step: popping a queued action runs no tensor op (the bookkeeping is numpy, see `_QueueState`),
    and between chunks a policy with one observation step does not need its observation at all: a rollout
    loop asks `wants_observation()` and passes `None` when it is False.
    """

    def __init__(self, *, n_obs_steps: int, n_action_steps: int):
        super().__init__()
        if n_obs_steps < 1 or n_action_steps < 1:
            raise ValueError(f"n_obs_steps={n_obs_steps} and n_action_steps={n_action_steps} must be >= 1")
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.reset()

    @property
    def chunk_env_ids(self) -> Tensor | None:
        """During `predict_action_chunk`: the env slots (LongTensor) its batch rows are, or None for all envs."""
        return self._state.chunk_env_ids

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
            self._state = _QueueState(self.n_obs_steps)
            self.on_reset(None)
            return
        state = self._state
        if state.batch_size == 0:  # nothing queued yet
            return
        ids = np.asarray(env_ids.cpu() if isinstance(env_ids, Tensor) else env_ids, dtype=np.int64)
        state.first_step[ids] = state.step
        state.chunk_step[ids] = _NO_CHUNK
        state.refill_step = state.step
        state.aligned_step = None
        self.on_reset(torch.from_numpy(ids))

    def wants_observation(self) -> bool:
        """Whether the next `select_action` reads its observation: a chunk is due, or the history keeps it.

        When False, `select_action(None)` pops the queued actions and the caller can skip converting (and,
        on a GPU, transferring) an observation nobody reads: with one observation step and chunks of N
        actions, N - 1 of every N steps.
        """
        state = self._state
        return self.n_obs_steps > 1 or state.batch_size == 0 or state.step >= state.refill_step

    def steps_until_chunk(self) -> int:
        """How many `select_action` calls pop queued actions before one predicts a chunk (0: the next one)."""
        state = self._state
        return 0 if state.batch_size == 0 else max(state.refill_step - state.step, 0)

    def select_action(self, batch: dict[str, Tensor] | None, as_numpy: bool = False) -> Tensor | np.ndarray:
        """Return one action per env (B, action_dim) for the current observations (B, ...).

        `batch` may be None when `wants_observation()` is False. A step that only pops queued actions runs
        no tensor op: the history is stacked and the queue indexed only when a chunk is predicted, or when
        envs are at different positions of their chunks. `as_numpy=True` returns a numpy array (what an
        env takes), copied from the device once per chunk rather than once per step.
        """
        state = self._state
        if batch is not None:
            state = self._observe(batch)
        elif self.wants_observation():
            raise ValueError(
                "select_action(None) at a step that needs the observation (a chunk is due or the history "
                "keeps it): pass the batch whenever policy.wants_observation() is True"
            )
        step = state.step
        if step >= state.refill_step:
            if torch.is_grad_enabled():
                with torch.no_grad():
                    self._refill(state, step)
            else:  # an evaluation loop already runs without autograd: entering no_grad per chunk costs
                self._refill(state, step)
        state.step = step + 1
        if as_numpy:
            if state.queue_numpy is None:
                queue = state.queue.float() if state.queue.dtype == torch.bfloat16 else state.queue
                state.queue_numpy = queue.numpy(force=True)  # copies to the host only from a device
                # All (B, action_dim) columns at once: popping one is then a list index, not numpy indexing.
                state.numpy_columns = list(state.queue_numpy.swapaxes(0, 1))
            if state.aligned_step is not None:
                return state.numpy_columns[step - state.aligned_step]
            return state.queue_numpy[np.arange(state.batch_size), step - state.chunk_step]
        if state.aligned_step is not None:
            if not state.columns:
                state.columns = state.queue.unbind(1)
            return state.columns[step - state.aligned_step]
        device = state.queue.device
        pos = torch.from_numpy(step - state.chunk_step).to(device)
        return state.queue[torch.arange(state.batch_size, device=device), pos]

    def _observe(self, batch: dict[str, Tensor]) -> _QueueState:
        """Add the observation keys of `batch` to the history (restarting on a new batch size or key set)."""
        obs = {k: v for k, v in batch.items() if k.startswith(OBS_PREFIX)}
        if not obs:
            raise KeyError(
                f"select_action needs observation keys (starting with {OBS_PREFIX!r}), got {list(batch)}"
            )
        state = self._state
        batch_size = next(iter(obs.values())).shape[0]
        if state.batch_size != batch_size or (state.obs and state.obs[-1].keys() != obs.keys()):
            self.reset()
            state = self._state
            state.start(batch_size)
        # Older observations must survive the caller reusing its buffers (a vector env with copy=False).
        state.obs.append({k: v.detach().clone() for k, v in obs.items()} if self.n_obs_steps > 1 else obs)
        return state

    def _refill(self, state: _QueueState, step: int) -> None:
        """Predict new chunks for the envs whose queue is empty at `step`."""
        if state.aligned_step is not None:  # all envs share one chunk, so all ran out together
            ids = None
        else:
            empty = state.chunk_step + self.n_action_steps <= step
            ids = None if empty.all() else np.flatnonzero(empty)
        self._fill_queue(state, self._stacked_history(state, ids), ids)
        if ids is None:
            state.chunk_step.fill(step)
            state.refill_step, state.aligned_step = step + self.n_action_steps, step
        else:
            state.chunk_step[ids] = step
            oldest, newest = int(state.chunk_step.min()), int(state.chunk_step.max())
            state.refill_step = oldest + self.n_action_steps
            state.aligned_step = step if oldest == newest else None
        state.columns, state.queue_numpy, state.numpy_columns = (), None, []  # made on demand

    def _stacked_history(self, state: _QueueState, ids: np.ndarray | None) -> dict[str, Tensor]:
        """`{key: (b, n_obs_steps, ...)}` for the envs `ids` (all when None), oldest first.

        Slots from before an env's reset (or before the first step) repeat its first observation since then.
        """
        entries = list(state.obs)
        n_kept, n_obs = len(entries), self.n_obs_steps
        source = None
        if n_obs > 1:  # with one observation step every env has a whole history
            # Observations each env has had since its reset, at most those kept.
            n_valid = np.minimum(state.step - state.first_step + 1, n_kept)
            if ids is not None:
                n_valid = n_valid[ids]
            if n_valid.min() < n_obs:
                # (b, n_obs): which kept entry fills each history slot.
                source = np.maximum(np.arange(n_obs) - n_obs + n_kept, (n_kept - n_valid)[:, None])
        history = {}
        for key in entries[-1]:
            if n_kept == 1:
                value = entries[0][key].unsqueeze(1)
            else:
                value = torch.stack([entry[key] for entry in entries], dim=1)  # (B, n_kept, ...)
            if ids is not None:
                value = value[torch.from_numpy(ids).to(value.device)]
            if source is not None:
                rows = torch.arange(value.shape[0], device=value.device).unsqueeze(1)
                value = value[rows, torch.from_numpy(source).to(value.device)]
            history[key] = value
        return history

    def _fill_queue(self, state: _QueueState, history: dict[str, Tensor], ids: np.ndarray | None) -> None:
        """Predict chunks for the envs `ids` (all envs when None) and queue them."""
        env_ids = None if ids is None else torch.from_numpy(ids).to(next(iter(history.values())).device)
        state.chunk_env_ids = env_ids
        try:
            chunk = self.predict_action_chunk(history)
        finally:
            state.chunk_env_ids = None
        n_envs = next(iter(history.values())).shape[0]
        if chunk.ndim != 3 or chunk.shape[0] != n_envs or chunk.shape[1] < self.n_action_steps:
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={n_envs}, T>={self.n_action_steps}, action_dim)"
            )
        if chunk.shape[1] > self.n_action_steps:
            chunk = chunk[:, : self.n_action_steps]
        if env_ids is None:
            state.queue = chunk
            return
        # A new tensor rather than an in-place write: actions returned earlier are views of the old queue.
        if state.queue is None:
            queue = chunk.new_zeros(state.batch_size, *chunk.shape[1:])
        else:
            queue = state.queue.clone()
        queue[env_ids] = chunk
        state.queue = queue


# Chunk step of an env with an empty queue: far enough in the past that the queue reads as empty.
_NO_CHUNK = -(2**40)


class _QueueState:
    """The per-env history and queue bookkeeping of `Policy.select_action`.

    A plain object rather than module attributes: `nn.Module.__setattr__` costs microseconds per write,
    and a step writes here. Per-env figures are numpy arrays (B,) so checking them costs no tensor op.
    """

    __slots__ = (
        "obs", "queue", "queue_numpy", "numpy_columns", "columns", "step", "batch_size", "first_step",
        "chunk_step", "refill_step", "aligned_step", "chunk_env_ids",
    )  # fmt: skip

    def __init__(self, n_obs_steps: int):
        self.obs: deque[dict[str, Tensor]] = deque(maxlen=n_obs_steps)  # newest last, each (B, ...)
        self.queue: Tensor | None = None  # (B, n_action_steps, action_dim)
        self.queue_numpy: np.ndarray | None = None  # the queue on the host, made at the first numpy request
        self.numpy_columns: list[np.ndarray] = []  # the (B, action_dim) columns of queue_numpy
        self.columns: tuple[Tensor, ...] = ()  # the queue's (B, action_dim) columns, when aligned
        self.step = 0  # index of the next `select_action` call
        self.batch_size = 0  # known at the first `select_action`
        self.first_step = np.zeros(0, dtype=np.int64)  # (B,) step of the first observation since reset
        self.chunk_step = np.zeros(0, dtype=np.int64)  # (B,) step the queued chunk was predicted at
        self.refill_step = 0  # first step at which some env's queue runs empty
        self.aligned_step: int | None = None  # the common chunk step when all envs share one
        self.chunk_env_ids: Tensor | None = None  # see `Policy.chunk_env_ids`

    def start(self, batch_size: int) -> None:
        """Size the per-env arrays for a batch of `batch_size` envs, all with empty queues."""
        self.batch_size = batch_size
        self.first_step = np.zeros(batch_size, dtype=np.int64)
        self.chunk_step = np.full(batch_size, _NO_CHUNK, dtype=np.int64)
