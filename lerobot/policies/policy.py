"""The `Policy` base class: observation history and action-chunk queue, shared by every policy.

A subclass implements `predict_action_chunk` (acting) and `forward` (training loss); everything that turns
chunks into one action per env step lives here, once.
"""

from __future__ import annotations

import abc
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from lerobot.checkpoints import hub, load_policy
from lerobot.constants import OBS_PREFIX
from lerobot.errors import NonFiniteActionError, PretrainedError

if TYPE_CHECKING:
    from lerobot.config import EnvConfig


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
    `ACTTemporalEnsembler` arithmetic (see `_select_ensembled_action`).

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
        if n_obs_steps < 1 or n_action_steps < 1:
            raise ValueError(f"n_obs_steps={n_obs_steps} and n_action_steps={n_action_steps} must be >= 1")
        if temporal_ensemble_coeff is not None and not (temporal_ensemble_coeff >= 0 and n_action_steps == 1):
            raise ValueError(
                f"temporal_ensemble_coeff={temporal_ensemble_coeff} must be >= 0 and needs n_action_steps=1 "
                f"(got {n_action_steps})"
            )
        self.n_obs_steps = n_obs_steps
        self.n_action_steps = n_action_steps
        self.temporal_ensemble_coeff = temporal_ensemble_coeff
        # Chunk length -> (weights, cumulative weights) of the ensemble, float32 (see `_ensemble_weights`).
        self._ensemble_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
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

    # ----------------------------------------------------------------- hub layout
    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | Path,
        device: str | torch.device = "cpu",
        revision: str | None = None,
        **overrides: Any,
    ) -> Policy:
        """The policy saved in a directory or hub repo (a run directory or checkpoint, this project's hub
        layout, or a LeRobot `pretrained_model`), in eval mode on `device`, with `overrides` of its config
        fields applied and validated (e.g. `n_action_steps=1`). Called on a subclass, the saved policy must be
        one of it. See `lerobot.checkpoints.load_policy`."""
        policy = load_policy(path_or_repo_id, device=device, revision=revision, **overrides)
        if not isinstance(policy, cls):
            raise PretrainedError(f"{path_or_repo_id} holds a {type(policy).__name__}, not a {cls.__name__}")
        return policy

    def save_pretrained(self, save_dir: str | Path, env_cfg: EnvConfig | None = None) -> Path:
        """Write `config.json` and `model.safetensors` (weights and normalization statistics) into
        `save_dir`; `env_cfg`, when given, is recorded so that evaluation needs no env name. Returns
        `save_dir`."""
        return hub.save_pretrained(self, save_dir, env_cfg)

    # ----------------------------------------------------------------- acting
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
        if env_ids is None:
            self._acting = _ActingState(deque(maxlen=self.n_obs_steps))
            self.on_reset(None)
            if episode_seeds is not None:
                self._set_streams(np.arange(len(episode_seeds)), episode_seeds)
            return
        state = self._acting
        ids = np.asarray(env_ids.cpu() if isinstance(env_ids, Tensor) else env_ids, dtype=np.int64)
        if episode_seeds is not None:
            self._set_streams(ids, episode_seeds)
        if state.batch_size == 0 or ids.size == 0:  # no env has acted yet, or none to clear
            return
        state.first_step[ids] = state.step
        state.chunk_step[ids] = _NO_CHUNK
        state.refill_step = state.step
        state.aligned_step = None
        if state.ensemble_count is not None:
            state.ensemble_count[ids] = 0  # their running means start over with the next chunk
        self.on_reset(torch.from_numpy(ids))

    def _set_streams(self, ids: np.ndarray, episode_seeds: Sequence[int]) -> None:
        if len(episode_seeds) != ids.size:
            raise ValueError(f"reset got {len(episode_seeds)} episode seeds for {ids.size} env slots")
        for slot, seed in zip(ids.tolist(), episode_seeds, strict=True):
            self._acting.streams[slot] = episode_stream(int(seed))

    def noise_generators(self) -> list[torch.Generator] | None:
        """During `predict_action_chunk` called by `select_action`: one CPU generator per row of its batch,
        the stream of the episode that row's env slot runs (draw from them in a fixed order, row by row,
        e.g. with diffusers' `randn_tensor`); None when some row's slot has none, or outside a
        `select_action`: draw from the global stream then."""
        state = self._acting
        if state.chunk_rows is None or not state.streams:
            return None
        generators = [state.streams.get(slot) for slot in state.chunk_rows.tolist()]
        return None if None in generators else generators

    def steps_until_chunk(self) -> int:
        """How many `select_action` calls only pop queued actions before one predicts a chunk (0: the next).

        Always 0 under temporal ensembling, which predicts at every step."""
        state = self._acting
        return max(state.refill_step - state.step, 0)

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
        if self.temporal_ensemble_coeff is not None:
            return self._select_ensembled_action(batch)
        state = self._acting
        if batch is None:
            if self.n_obs_steps > 1 or state.step >= state.refill_step:
                raise ValueError("select_action(None) needs n_obs_steps == 1 and steps_until_chunk() > 0")
        else:
            self._observe(state, batch)
            state = self._acting
        if state.step >= state.refill_step:
            self._queue_chunks(state, np.nonzero(state.chunk_step + self.n_action_steps <= state.step)[0])
        if state.aligned_step is not None:  # every env reads the same queue column: a view, no gather
            action = state.queue[:, state.step - state.aligned_step]
        else:
            action = state.queue[np.arange(state.batch_size), state.step - state.chunk_step]
        state.step += 1
        return action

    def _observe(self, state: _ActingState, batch: dict[str, Tensor]) -> None:
        """Add the observation keys of `batch` to the history (starting over on a new batch size or key set)."""
        obs = {k: v for k, v in batch.items() if k.startswith(OBS_PREFIX)}
        if not obs:
            raise KeyError(
                f"select_action needs observation keys (starting with {OBS_PREFIX!r}), got {list(batch)}"
            )
        batch_size = next(iter(obs.values())).shape[0]
        if batch_size != state.batch_size or (state.history and state.history[-1].keys() != obs.keys()):
            streams = state.streams  # given by resets before this first step: they stay
            self.reset()
            state = self._acting
            state.streams = streams
            state.batch_size = batch_size
            state.first_step = np.zeros(batch_size, dtype=np.int64)
            state.chunk_step = np.full(batch_size, _NO_CHUNK, dtype=np.int64)
        # Older observations must survive the caller reusing its tensors; with one step none is kept.
        state.history.append({k: v.detach().clone() for k, v in obs.items()} if self.n_obs_steps > 1 else obs)

    def _queue_chunks(self, state: _ActingState, ids: np.ndarray) -> None:
        """Predict chunks for the envs `ids` from their histories and queue their first n_action_steps."""
        history = self._stacked_history(state, ids)
        device = next(iter(history.values())).device
        state.chunk_env_ids = None if ids.size == state.batch_size else torch.from_numpy(ids).to(device)
        state.chunk_rows = ids
        try:
            chunk = self.predict_action_chunk(history)
        finally:
            state.chunk_env_ids = state.chunk_rows = None
        if chunk.ndim != 3 or chunk.shape[0] != ids.size or chunk.shape[1] < self.n_action_steps:
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={ids.size}, T>={self.n_action_steps}, action_dim)"
            )
        # A host copy (np.array copies) that the policy cannot change later, e.g. by reusing its tensors.
        chunk = np.array(chunk.to("cpu", torch.float32).numpy(force=True)[:, : self.n_action_steps])
        _refuse_non_finite(chunk, ids)  # once per chunk: the steps that pop its actions check nothing
        # A new queue rather than an in-place write: actions returned earlier may be views of the old one.
        if ids.size == state.batch_size:
            state.queue = chunk
        else:
            state.queue = state.queue.copy()
            state.queue[ids] = chunk
        state.chunk_step[ids] = state.step
        oldest = state.step if ids.size == state.batch_size else int(state.chunk_step.min())
        state.refill_step = oldest + self.n_action_steps
        state.aligned_step = oldest if oldest == state.step else None

    def _ensemble_weights(self, chunk_len: int) -> tuple[np.ndarray, np.ndarray]:
        """`(w, W)` for chunks of `chunk_len` actions, float32 `(chunk_len,)`: `w[i] = exp(-m * i)` and its
        running sum `W[i] = w[0] + ... + w[i]`.

        Computed by torch as LeRobot's `ACTTemporalEnsembler` computes them (float32 exp and cumsum), so that
        the ensembles agree to the last bit."""
        if chunk_len not in self._ensemble_tables:
            weights = torch.exp(-self.temporal_ensemble_coeff * torch.arange(chunk_len))
            self._ensemble_tables[chunk_len] = (weights.numpy(), torch.cumsum(weights, dim=0).numpy())
        return self._ensemble_tables[chunk_len]

    def _select_ensembled_action(self, batch: dict[str, Tensor] | None) -> np.ndarray:
        """`select_action_numpy` under temporal ensembling: a chunk `(B, T, A)` for every env at every step, merged
        into each env's running means of the next T steps.

        Per env, `mean[j]` is the mean of the `n[j]` predictions made so far for step `now + j` (since the
        env's reset), the i-th oldest weighted by `w[i]`. A new prediction `a[j]` for that step enters as

            mean[j] <- (mean[j] * W[n[j] - 1] + a[j] * w[n[j]]) / W[n[j]]       (mean[j] <- a[j] if n[j] = 0)

        which is LeRobot's online update, the same float32 operations in the same order. Then `mean[0]` is
        executed and the window moves one step on. Everything is elementwise over `(B, T, A)` host arrays,
        so an env's actions depend on its own chunks only, never on the other envs of the batch.
        """
        if batch is None:
            raise ValueError("select_action(None) needs n_obs_steps == 1 and steps_until_chunk() > 0")
        self._observe(self._acting, batch)
        state = self._acting
        ids = np.arange(state.batch_size)
        history = self._stacked_history(state, ids)
        state.chunk_rows = ids
        try:
            chunk = self.predict_action_chunk(history)
        finally:
            state.chunk_rows = None
        if chunk.ndim != 3 or chunk.shape[0] != state.batch_size:
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)}; expected "
                f"(B={state.batch_size}, T, action_dim)"
            )
        chunk = chunk.to("cpu", torch.float32).numpy(force=True)  # (B, T, A); read, never stored
        batch_size, chunk_len, action_dim = chunk.shape
        weights, cumulative = self._ensemble_weights(chunk_len)
        if state.ensemble is None:
            state.ensemble = np.zeros((batch_size, chunk_len - 1, action_dim), dtype=np.float32)
            state.ensemble_count = np.zeros((batch_size, chunk_len - 1), dtype=np.int64)
        elif state.ensemble.shape[1:] != (chunk_len - 1, action_dim):
            raise ValueError(
                f"{type(self).__name__}.predict_action_chunk returned shape {tuple(chunk.shape)} after chunks of "
                f"{state.ensemble.shape[1] + 1} actions: temporal ensembling needs one chunk length"
            )
        count = state.ensemble_count  # (B, T-1): predictions already in the mean of steps now .. now+T-2
        overlap = chunk[:, :-1]
        updated = state.ensemble * cumulative[np.maximum(count - 1, 0)][..., None]
        updated = updated + overlap * weights[count][..., None]
        updated = updated / cumulative[count][..., None]
        merged = np.concatenate([np.where((count == 0)[..., None], overlap, updated), chunk[:, -1:]], axis=1)
        _refuse_non_finite(merged[:, :1], ids)
        # New arrays every step (no in-place write), so actions returned earlier never change.
        state.ensemble = merged[:, 1:]
        counts = np.concatenate([count + 1, np.ones((batch_size, 1), np.int64)], axis=1)  # (B, T)
        state.ensemble_count = counts[:, 1:]
        state.step += 1
        state.refill_step = state.step  # the next call predicts again: steps_until_chunk() == 0
        return merged[:, 0]

    def _stacked_history(self, state: _ActingState, ids: np.ndarray) -> dict[str, Tensor]:
        """`{key: (b, n_obs_steps, ...)}` for the envs `ids`, oldest first.

        History slots from before an env's reset (or before its first step) repeat its first observation
        since then.
        """
        n_kept, source = len(state.history), None
        if self.n_obs_steps > 1:  # with one step, every env's history is its newest observation
            n_valid = np.minimum(state.step - state.first_step[ids] + 1, n_kept)  # observations since reset
            if n_valid.min() < self.n_obs_steps:
                # (b, n_obs_steps): the kept observation each slot takes, clamped to the env's first valid one.
                first = (n_kept - n_valid)[:, None]
                source = torch.from_numpy(
                    np.maximum(np.arange(self.n_obs_steps) + n_kept - self.n_obs_steps, first)
                )
        rows = None if ids.size == state.batch_size else torch.from_numpy(ids)
        history = {}
        for key in state.history[-1]:
            if self.n_obs_steps == 1:  # a view: predict_action_chunk reads it before the next observation
                value = state.history[-1][key].unsqueeze(1)  # (B, 1, ...)
            else:
                value = torch.stack([entry[key] for entry in state.history], dim=1)  # (B, n_kept, ...)
            if rows is not None:
                value = value[rows.to(value.device)]
            if source is not None:
                value = value[torch.arange(ids.size, device=value.device)[:, None], source.to(value.device)]
            history[key] = value
        return history


def _refuse_non_finite(actions: np.ndarray, slots: np.ndarray) -> None:
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


# Mixed into every episode stream's seed, so that a stream never equals the env's own reset stream (which the
# same integer seeds) nor a stream seeded with that integer elsewhere.
_STREAM_KEY = 0x5EED_AC75


def episode_stream(episode_seed: int) -> torch.Generator:
    """The random stream of the episode with seed `episode_seed`: a CPU `torch.Generator` whose state
    depends on that seed only (hashed with `numpy.random.SeedSequence`, so nearby seeds give unrelated
    streams)."""
    state = np.random.SeedSequence([episode_seed, _STREAM_KEY]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


# `chunk_step` of an env with an empty queue: far enough in the past that its queue reads as used up.
_NO_CHUNK = -(2**40)


@dataclass
class _ActingState:
    """Per-env history and queue of `Policy.select_action`, counted in `select_action` calls (steps).

    A plain object rather than module attributes, because `nn.Module.__setattr__` runs type checks on
    every write and a step writes here.
    """

    history: deque[dict[str, Tensor]]  # the last n_obs_steps observations, newest last, each (B, ...)
    step: int = 0  # index of the next select_action call
    batch_size: int = 0  # known at the first call
    queue: np.ndarray | None = None  # (B, n_action_steps, action_dim) on the host
    first_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (B,) since reset
    chunk_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (B,) queued at
    refill_step: int = 0  # first step at which some env's queue is used up
    aligned_step: int | None = None  # the chunk step all envs share, when they share one
    chunk_env_ids: Tensor | None = None  # see `Policy.chunk_env_ids`
    chunk_rows: np.ndarray | None = None  # during predict_action_chunk: the env slots of its rows
    streams: dict[int, torch.Generator] = field(default_factory=dict)  # env slot -> its episode's stream
    # Temporal ensembling only: running means (B, T-1, action_dim) of the next T-1 steps' actions, and how
    # many predictions each holds (B, T-1), 0 for an env that has none yet (reset).
    ensemble: np.ndarray | None = None
    ensemble_count: np.ndarray | None = None
