"""Which action each env runs now: the acting state that `Policy.select_action` keeps for every env slot.

One call of `ActingState.act` is one env step of B envs:

1. observe: the step's observations join the history of the last `n_obs_steps` (a new batch size or key set
   starts every env over);
2. which envs need a chunk: those whose queued `n_action_steps` actions are used up (all of them at every
   step under temporal ensembling);
3. queue it: the policy predicts a chunk for just those envs from their stacked histories; it is copied to
   the host once, refused if it holds a NaN or infinite action, and its first `n_action_steps` actions
   replace their queues;
4. pop: each env's action for this step is read from its queue (or, under temporal ensembling, is the
   running mean of the predictions made for this step, `TemporalEnsemble`).

`reset(env_ids)` starts the given env slots over (history, queue, ensemble) while the others keep theirs,
and gives each the random stream of the episode it begins (`episode_stream`), which the policy's draws
come from (`noise_generators`). Counting is in steps (calls of `act`), with one step counter for all
envs: an env slot's state is the step of its reset and of its queued chunk.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from lerobot.constants import OBS_PREFIX
from lerobot.errors import NonFiniteActionError

# `chunk_step` of an env with an empty queue: far enough in the past that its queue reads as used up.
_NO_CHUNK = -(2**40)

# Mixed into every episode stream's seed, so that a stream never equals the env's own reset stream (which the
# same integer seeds) nor a stream seeded with that integer elsewhere.
_STREAM_KEY = 0x5EED_AC75


class ChunkPredictor(Protocol):
    """What `ActingState` asks of a policy: chunks of actions, and the hook for per-env state of its own."""

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Actions (b, T, action_dim) from the stacked histories (b, n_obs_steps, ...) of b env slots."""

    def on_reset(self, env_ids: Tensor | None) -> None:
        """Called after env slots `env_ids` (None: all) started over."""


class ActingState:
    """Per-env observation history, action-chunk queue, temporal ensemble and episode streams of a policy.

    A plain object rather than `nn.Module` attributes, because `nn.Module.__setattr__` runs type checks on
    every write and a step writes here. The rules and their timing are those of `Policy` (its docstring).
    """

    def __init__(self, n_obs_steps: int, n_action_steps: int, temporal_ensemble_coeff: float | None = None):
        if n_obs_steps < 1 or n_action_steps < 1:
            raise ValueError(f"n_obs_steps={n_obs_steps} and n_action_steps={n_action_steps} must be >= 1")
        if temporal_ensemble_coeff is not None and not (temporal_ensemble_coeff >= 0 and n_action_steps == 1):
            raise ValueError(
                f"temporal_ensemble_coeff={temporal_ensemble_coeff} must be >= 0 and needs n_action_steps=1 "
                f"(got {n_action_steps})"
            )
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.ensemble = None if temporal_ensemble_coeff is None else TemporalEnsemble(temporal_ensemble_coeff)
        self.streams: dict[int, torch.Generator] = {}  # env slot -> the stream of the episode it runs
        self.chunk_env_ids: Tensor | None = None  # see `Policy.chunk_env_ids`
        self.chunk_rows: np.ndarray | None = None  # during predict_action_chunk: the env slots of its rows
        self._start_over(0)

    def _start_over(self, batch_size: int) -> None:
        """Forget every env's history, queue and ensemble; `batch_size` envs, none of which has acted."""
        self.history: deque[dict[str, Tensor]] = deque(maxlen=self.n_obs_steps)  # newest last, each (B, ...)
        self.step = 0  # index of the next `act` call
        self.batch_size = batch_size  # 0 until the first observation
        self.queue: np.ndarray | None = None  # (B, n_action_steps, action_dim) on the host
        self.first_step = np.zeros(batch_size, dtype=np.int64)  # (B,) the step of each env's reset
        self.chunk_step = np.full(batch_size, _NO_CHUNK, dtype=np.int64)  # (B,) when its queue was filled
        self.refill_step = 0  # first step at which some env's queue is used up
        self.aligned_step: int | None = None  # the chunk step all envs share, when they share one
        if self.ensemble is not None:
            self.ensemble.clear()

    # ----------------------------------------------------------------- reset and streams
    def reset(
        self,
        policy: ChunkPredictor,
        env_ids: Sequence[int] | Tensor | np.ndarray | None = None,
        episode_seeds: Sequence[int] | None = None,
    ) -> None:
        """Start all env slots (`None`) or only `env_ids` over, then call `policy.on_reset` for them.

        `episode_seeds`, one per slot of `env_ids` (of slots 0, 1, ... when `env_ids` is None), give those
        slots their episodes' streams; a full reset without them forgets every stream. A partial reset
        before the first step, or of no slot, only sets streams."""
        if env_ids is None:
            self._start_over(0)
            self.streams, self.chunk_env_ids, self.chunk_rows = {}, None, None
            policy.on_reset(None)
            if episode_seeds is not None:
                self._set_streams(np.arange(len(episode_seeds)), episode_seeds)
            return
        ids = np.asarray(env_ids.cpu() if isinstance(env_ids, Tensor) else env_ids, dtype=np.int64)
        if episode_seeds is not None:
            self._set_streams(ids, episode_seeds)
        if self.batch_size == 0 or ids.size == 0:  # no env has acted yet, or none to clear
            return
        self.first_step[ids] = self.step
        self.chunk_step[ids] = _NO_CHUNK
        self.refill_step = self.step
        self.aligned_step = None
        if self.ensemble is not None:
            self.ensemble.forget(ids)
        policy.on_reset(torch.from_numpy(ids))

    def _set_streams(self, ids: np.ndarray, episode_seeds: Sequence[int]) -> None:
        if len(episode_seeds) != ids.size:
            raise ValueError(f"reset got {len(episode_seeds)} episode seeds for {ids.size} env slots")
        for slot, seed in zip(ids.tolist(), episode_seeds, strict=True):
            self.streams[slot] = episode_stream(int(seed))

    def noise_generators(self) -> list[torch.Generator] | None:
        """During a chunk prediction: the episode stream of each row's env slot; None when some row's slot
        has none, or outside a prediction."""
        if self.chunk_rows is None or not self.streams:
            return None
        generators = [self.streams.get(slot) for slot in self.chunk_rows.tolist()]
        return None if None in generators else generators

    def steps_until_chunk(self) -> int:
        """How many `act` calls only pop queued actions before one predicts a chunk (0: the next)."""
        return max(self.refill_step - self.step, 0)

    # ----------------------------------------------------------------- one step
    def act(self, policy: ChunkPredictor, batch: dict[str, Tensor] | None) -> np.ndarray:
        """This step's action of every env, (B, action_dim) float32 on the host (see `Policy.select_action`).

        `batch` may be None when nothing reads it: no history is kept (`n_obs_steps == 1`) and no chunk is
        due (`steps_until_chunk() > 0`)."""
        if self.ensemble is not None:
            return self._act_ensembled(policy, batch)
        if batch is None:
            if self.n_obs_steps > 1 or self.step >= self.refill_step:
                raise ValueError("select_action(None) needs n_obs_steps == 1 and steps_until_chunk() > 0")
        else:
            self.observe(policy, batch)
        if self.step >= self.refill_step:
            self._queue_chunks(policy, np.nonzero(self.chunk_step + self.n_action_steps <= self.step)[0])
        if self.aligned_step is not None:  # every env reads the same queue column: a view, no gather
            action = self.queue[:, self.step - self.aligned_step]
        else:
            action = self.queue[np.arange(self.batch_size), self.step - self.chunk_step]
        self.step += 1
        return action

    def observe(self, policy: ChunkPredictor, batch: dict[str, Tensor]) -> None:
        """Add the observation keys of `batch` to the history (starting over on a new batch size or key set)."""
        obs = {k: v for k, v in batch.items() if k.startswith(OBS_PREFIX)}
        if not obs:
            raise KeyError(
                f"select_action needs observation keys (starting with {OBS_PREFIX!r}), got {list(batch)}"
            )
        batch_size = next(iter(obs.values())).shape[0]
        if batch_size != self.batch_size or (self.history and self.history[-1].keys() != obs.keys()):
            streams = self.streams  # given by resets before this first step: they stay
            self.reset(policy)
            self.streams = streams
            self._start_over(batch_size)
        # Older observations must survive the caller reusing its tensors; with one step none is kept.
        self.history.append({k: v.detach().clone() for k, v in obs.items()} if self.n_obs_steps > 1 else obs)

    def _queue_chunks(self, policy: ChunkPredictor, ids: np.ndarray) -> None:
        """Predict chunks for the envs `ids` from their histories and queue their first n_action_steps."""
        chunk = self._predict(policy, ids)
        if chunk.ndim != 3 or chunk.shape[0] != ids.size or chunk.shape[1] < self.n_action_steps:
            raise ValueError(
                f"{type(policy).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={ids.size}, T>={self.n_action_steps}, action_dim)"
            )
        # A host copy (np.array copies) that the policy cannot change later, e.g. by reusing its tensors.
        chunk = np.array(chunk.to("cpu", torch.float32).numpy(force=True)[:, : self.n_action_steps])
        refuse_non_finite(chunk, ids)  # once per chunk: the steps that pop its actions check nothing
        # A new queue rather than an in-place write: actions returned earlier may be views of the old one.
        if ids.size == self.batch_size:
            self.queue = chunk
        else:
            self.queue = self.queue.copy()
            self.queue[ids] = chunk
        self.chunk_step[ids] = self.step
        oldest = self.step if ids.size == self.batch_size else int(self.chunk_step.min())
        self.refill_step = oldest + self.n_action_steps
        self.aligned_step = oldest if oldest == self.step else None

    def _act_ensembled(self, policy: ChunkPredictor, batch: dict[str, Tensor] | None) -> np.ndarray:
        """`act` under temporal ensembling: every env predicts a chunk (B, T, A) at every step, merged into
        its running means (`TemporalEnsemble.add`), whose first is this step's action."""
        if batch is None:
            raise ValueError("select_action(None) needs n_obs_steps == 1 and steps_until_chunk() > 0")
        self.observe(policy, batch)
        ids = np.arange(self.batch_size)
        chunk = self._predict(policy, ids)
        if chunk.ndim != 3 or chunk.shape[0] != self.batch_size:
            raise ValueError(
                f"{type(policy).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={self.batch_size}, T, action_dim)"
            )
        chunk = chunk.to("cpu", torch.float32).numpy(force=True)  # (B, T, A); read, never stored
        means = self.ensemble.means  # (B, T-1, A) of the previous chunks, None before the first
        if means is not None and means.shape[1:] != (chunk.shape[1] - 1, chunk.shape[2]):
            raise ValueError(
                f"{type(policy).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)} after chunks of "
                f"{means.shape[1] + 1} actions: temporal ensembling needs one chunk length"
            )
        action = self.ensemble.add(chunk)
        self.step += 1
        self.refill_step = self.step  # the next call predicts again: steps_until_chunk() == 0
        return action

    def _predict(self, policy: ChunkPredictor, ids: np.ndarray) -> Tensor:
        """`policy.predict_action_chunk` on the stacked histories of the env slots `ids`, with `chunk_env_ids`
        and `chunk_rows` naming those slots while it runs."""
        history = self.stacked_history(ids)
        device = next(iter(history.values())).device
        self.chunk_env_ids = None if ids.size == self.batch_size else torch.from_numpy(ids).to(device)
        self.chunk_rows = ids
        try:
            return policy.predict_action_chunk(history)
        finally:
            self.chunk_env_ids = self.chunk_rows = None

    def stacked_history(self, ids: np.ndarray) -> dict[str, Tensor]:
        """`{key: (b, n_obs_steps, ...)}` for the envs `ids`, oldest first.

        History slots from before an env's reset (or before its first step) repeat its first observation
        since then.
        """
        n_kept, source = len(self.history), None
        if self.n_obs_steps > 1:  # with one step, every env's history is its newest observation
            n_valid = np.minimum(self.step - self.first_step[ids] + 1, n_kept)  # observations since reset
            if n_valid.min() < self.n_obs_steps:
                # (b, n_obs_steps): the kept observation each slot takes, clamped to the env's first valid one.
                first = (n_kept - n_valid)[:, None]
                source = torch.from_numpy(
                    np.maximum(np.arange(self.n_obs_steps) + n_kept - self.n_obs_steps, first)
                )
        rows = None if ids.size == self.batch_size else torch.from_numpy(ids)
        history = {}
        for key in self.history[-1]:
            if self.n_obs_steps == 1:  # a view: predict_action_chunk reads it before the next observation
                value = self.history[-1][key].unsqueeze(1)  # (B, 1, ...)
            else:
                value = torch.stack([entry[key] for entry in self.history], dim=1)  # (B, n_kept, ...)
            if rows is not None:
                value = value[rows.to(value.device)]
            if source is not None:
                value = value[torch.arange(ids.size, device=value.device)[:, None], source.to(value.device)]
            history[key] = value
        return history


class TemporalEnsemble:
    """ACT's temporal ensembling (Zhao et al. 2023) over B env slots, with LeRobot's `ACTTemporalEnsembler`
    arithmetic.

    Per env, `mean[j]` is the mean of the `n[j]` predictions made so far for step `now + j` (since the env's
    reset), the i-th oldest weighted by `w[i] = exp(-m * i)`, `W[i] = w[0] + ... + w[i]`. A new prediction
    `a[j]` for that step enters as

        mean[j] <- (mean[j] * W[n[j] - 1] + a[j] * w[n[j]]) / W[n[j]]       (mean[j] <- a[j] if n[j] = 0)

    which is LeRobot's online update, the same float32 operations in the same order. Then `mean[0]` is
    executed and the window moves one step on. Everything is elementwise over `(B, T, A)` host arrays, so an
    env's actions depend on its own chunks only, never on the other envs of the batch.
    """

    def __init__(self, coeff: float):
        self.coeff = coeff
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # chunk length -> (w, W)
        self.means: np.ndarray | None = None  # (B, T-1, A): the running means of the next T-1 steps
        self.counts: np.ndarray | None = None  # (B, T-1): predictions in each mean, 0 for none (reset)

    def clear(self) -> None:
        """Forget every env's means (a full reset: the next chunk sets B and T)."""
        self.means = self.counts = None

    def forget(self, ids: np.ndarray) -> None:
        """Start the means of the env slots `ids` over with their next chunk."""
        if self.counts is not None:
            self.counts[ids] = 0

    def weights(self, chunk_len: int) -> tuple[np.ndarray, np.ndarray]:
        """`(w, W)` for chunks of `chunk_len` actions, float32 `(chunk_len,)`.

        Computed by torch as LeRobot computes them (float32 exp and cumsum), so that the ensembles agree to
        the last bit."""
        if chunk_len not in self._tables:
            weights = torch.exp(-self.coeff * torch.arange(chunk_len))
            self._tables[chunk_len] = (weights.numpy(), torch.cumsum(weights, dim=0).numpy())
        return self._tables[chunk_len]

    def add(self, chunk: np.ndarray) -> np.ndarray:
        """Merge a chunk `(B, T, A)` float32 (row b: env slot b) into the means; return this step's actions
        `(B, A)`. A non-finite action of this step raises `NonFiniteActionError` and changes nothing."""
        batch_size, chunk_len, action_dim = chunk.shape
        weights, cumulative = self.weights(chunk_len)
        if self.means is None:
            self.means = np.zeros((batch_size, chunk_len - 1, action_dim), dtype=np.float32)
            self.counts = np.zeros((batch_size, chunk_len - 1), dtype=np.int64)
        count = self.counts  # (B, T-1): predictions already in the mean of steps now .. now+T-2
        overlap = chunk[:, :-1]
        updated = self.means * cumulative[np.maximum(count - 1, 0)][..., None]
        updated = updated + overlap * weights[count][..., None]
        updated = updated / cumulative[count][..., None]
        merged = np.concatenate([np.where((count == 0)[..., None], overlap, updated), chunk[:, -1:]], axis=1)
        refuse_non_finite(merged[:, :1], np.arange(batch_size))
        # New arrays every step (no in-place write), so actions returned earlier never change.
        self.means = merged[:, 1:]
        counts = np.concatenate([count + 1, np.ones((batch_size, 1), np.int64)], axis=1)  # (B, T)
        self.counts = counts[:, 1:]
        return merged[:, 0]


def refuse_non_finite(actions: np.ndarray, slots: np.ndarray) -> None:
    """Raise `NonFiniteActionError` for the first non-finite action of `actions` (b, T, A), the next T
    actions of the env slots `slots` (b,)."""
    # One reduction instead of an elementwise test: any NaN or infinity makes the sum non-finite. Summed in
    # float64, finite float32 actions cannot overflow it; the exact test is only reached on a non-finite sum.
    if math.isfinite(actions.sum(dtype=np.float64)) or np.isfinite(actions).all():
        return
    row, ahead = (int(i) for i in np.argwhere(~np.isfinite(actions).all(axis=-1))[0])
    action = actions[row, ahead].tolist()
    raise NonFiniteActionError(
        f"the policy returned a non-finite action {action} for env slot {slots[row]}",
        int(slots[row]),
        ahead,
        action,
    )


def episode_stream(episode_seed: int) -> torch.Generator:
    """The random stream of the episode with seed `episode_seed`: a CPU `torch.Generator` whose state
    depends on that seed only (hashed with `numpy.random.SeedSequence`, so nearby seeds give unrelated
    streams)."""
    state = np.random.SeedSequence([episode_seed, _STREAM_KEY]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))
