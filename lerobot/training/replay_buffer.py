"""Replay buffer of transitions from `n_envs` vector envs, sampled as contiguous sub-trajectories (TD-MPC).

Layout: a ring of `capacity // n_envs` rows; row r holds one vector step, i.e. one transition per env:

    obs[key]       (rows, n_envs, *shape)  observation o_t                      (batch keys, float32;
    next_obs[key]  (rows, n_envs, *shape)  the real next observation o_{t+1}     images uint8, see below)
    action         (rows, n_envs, A)
    reward         (rows, n_envs)
    terminated     (rows, n_envs)          episode ended by the task: do not bootstrap
    truncated      (rows, n_envs)          episode cut by the time limit: do bootstrap
    done           (rows, n_envs)          terminated or truncated
    valid          (rows, n_envs)          False for rows that are not transitions (NEXT_STEP autoreset)
    episode, step  (rows, n_envs)          per-env episode counter and index of the step in its episode

Images (uint8 (B, H, W, C) from the env) are kept as uint8 (rows, n_envs, C, H, W), a quarter of float32's
memory, and `sample` scales them to float32 in [0, 1] as `observation_to_batch` does.

Gymnasium 1.x autoreset (`add_env_step` handles it; pick the mode the envs were built with):
- `AutoresetMode.SAME_STEP` (what the online trainer uses): the step that ends an episode already returns
  the first observation of the next one; the episode's real last observation is in `info["final_obs"][i]`
  where `info["_final_obs"][i]`. We store that final observation as `next_obs`, so every step is a transition.
- `AutoresetMode.NEXT_STEP`: the step that ends an episode returns its real final observation; the following
  step ignores the action, resets, and returns the reset observation with reward 0. That step is not a
  transition: it is written as an invalid row and never sampled.
- `AutoresetMode.DISABLED`: the caller resets envs itself; every step is stored as given.

Sub-trajectories: a sample of length H starts at (row t, env e) and covers rows t .. t+H-1 of env e, all in
one episode (no episode end before its last step), all written and none overwritten. Starting points are
drawn uniformly among all valid ones by rejection. Episodes shorter than H cannot be sampled.

Prioritised replay (Schaul et al. 2016, as TD-MPC uses it), when `alpha > 0`: every start has a priority p
(new rows get the largest priority seen so far, so each is drawn soon), a start is drawn with probability
P = p**alpha / (sum over all valid starts) (drawn among all rows, invalid starts rejected), and the batch
carries each sample's importance weight (N * P)**-beta / (the batch's largest), N the number of valid starts,
and where it was drawn from, so that the trainer can write the policy's new priorities back
(`update_priorities`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import Tensor

from lerobot.constants import (
    ACTION,
    NEXT_DONE,
    NEXT_REWARD,
    NEXT_TERMINATED,
    NEXT_TRUNCATED,
    REPLAY_INDEX,
    SAMPLE_WEIGHT,
)
from lerobot.envs.observation import channels_first, image_to_float, is_image
from lerobot.errors import ConfigError

_MAX_REJECTION_ROUNDS = 64
# Added to every written-back priority so that no start becomes impossible to draw (TD-MPC's value).
_PRIORITY_EPS = 1e-6


def final_observations(next_obs: Any, info: Mapping[str, Any]) -> Any:
    """The real next observation of a SAME_STEP autoreset vector step: `info["final_obs"]` where an episode ended.

    Works for array observations (n_envs, ...) and dict observations {key: (n_envs, ...)}; returns a copy
    only when something had to be replaced.
    """
    mask = info.get("_final_obs")
    if mask is None or not np.any(mask):
        return next_obs
    final = info["final_obs"]
    ended = np.flatnonzero(mask)
    if isinstance(next_obs, Mapping):
        out = {k: np.array(v, copy=True) for k, v in next_obs.items()}
        for i in ended:
            for k in out:
                out[k][i] = final[i][k]
        return out
    out = np.array(next_obs, copy=True)
    for i in ended:
        out[i] = final[i]
    return out


def _as_tensor(x: Any, dtype: torch.dtype | None = None) -> Tensor:
    t = x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
    return t.to("cpu", dtype=dtype) if dtype is not None else t.cpu()


def _as_stored(x: Any) -> Tensor:
    """An observation entry (B, ...) as the buffer keeps it: an image, uint8 (B, C, H, W), as it is (a quarter
    of float32's memory; `gather` scales it), anything else as float32."""
    t = _as_tensor(x)
    return t if t.ndim == 4 and t.dtype == torch.uint8 else t.to(torch.float32)


def _to_stored(obs: Any, to_batch: Callable[[Any], Mapping[str, Any]]) -> Mapping[str, Any]:
    """`to_batch(obs)` for `add`, except that the images of a dict observation (`is_image`: (B, H, W, C) uint8)
    skip it: they go to `add` as uint8 (B, C, H, W) views, which it keeps so."""
    if not isinstance(obs, Mapping):
        return to_batch(obs)
    arrays = {k: np.asarray(v) for k, v in obs.items()}
    images = {k: channels_first(v) for k, v in arrays.items() if is_image(v)}
    return {**to_batch({k: v for k, v in arrays.items() if k not in images}), **images}


def _unwritten(*shape: int, dtype: torch.dtype) -> Tensor:
    """Storage for observations: left uninitialised, so that its memory is committed row by row as the buffer
    fills (a buffer of 100,000 pixel transitions holds 12.7 GB; a run of 12,500 touches 1.6 GB of it). A row
    is read only once written: sampling draws valid rows alone, and `state_dict` keeps the filled ones."""
    return torch.empty(*shape, dtype=dtype)


def _unscale_(images: Tensor) -> Tensor:
    """Images scaled to [0, 1] (k / 255, as `image_to_float` gives them) back to their uint8 k; scales
    `images` in place, so that no second float copy is needed."""
    return images.mul_(255.0).round_().to(torch.uint8)


class ReplayBuffer:
    """Ring buffer of vector-env transitions with episode-aware sub-trajectory sampling.

    Args:
        capacity: total transitions kept (over all envs); the oldest rows are overwritten.
        n_envs: transitions per `add` (one per env).
        seed: seed of the sampling generator.
        alpha: priority exponent of prioritised replay; 0 draws uniformly (and keeps no priorities in use).
        beta: importance-weight exponent of prioritised replay (1 corrects the sampling bias fully).
    """

    def __init__(self, capacity: int, n_envs: int = 1, seed: int = 0, alpha: float = 0.0, beta: float = 0.4):
        if capacity < n_envs or n_envs < 1:
            raise ValueError(f"capacity={capacity} must be >= n_envs={n_envs} >= 1")
        if alpha < 0 or not 0 <= beta <= 1:
            raise ValueError(f"prioritised replay needs alpha >= 0 and beta in [0, 1], got {alpha}, {beta}")
        self.alpha, self.beta = alpha, beta
        self.max_priority = 1.0
        self.rows = capacity // n_envs
        self.n_envs = n_envs
        self.pos = 0  # next row to write
        self.full = False
        self.obs: dict[str, Tensor] = {}
        self.next_obs: dict[str, Tensor] = {}
        self.data: dict[str, Tensor] = {}
        self._cur_episode = torch.zeros(n_envs, dtype=torch.int64)
        self._cur_step = torch.zeros(n_envs, dtype=torch.int64)
        self._autoreset_pending = torch.zeros(n_envs, dtype=torch.bool)
        self.generator = torch.Generator().manual_seed(seed)

    # ----------------------------------------------------------------- sizes
    @property
    def filled_rows(self) -> int:
        return self.rows if self.full else self.pos

    def __len__(self) -> int:
        """Number of stored transitions (valid rows over all envs)."""
        if not self.data:
            return 0
        return int(self.data["valid"][: self.filled_rows].sum())

    # ----------------------------------------------------------------- writing
    def _allocate(self, obs: Mapping[str, Tensor], action: Tensor) -> None:
        shape = (self.rows, self.n_envs)
        try:
            for key, value in obs.items():
                self.obs[key] = _unwritten(*shape, *value.shape[1:], dtype=value.dtype)
                self.next_obs[key] = _unwritten(*shape, *value.shape[1:], dtype=value.dtype)
        except RuntimeError as e:  # torch's allocator: the observations alone do not fit in memory
            self.obs, self.next_obs = {}, {}
            per_transition = sum(2 * v[0].numel() * v.element_size() for v in obs.values())
            raise ConfigError(
                f"the replay buffer cannot allocate {self.rows * self.n_envs * per_transition / 1e9:.1f} GB for "
                f"{self.rows * self.n_envs} transitions of {per_transition / 1e3:.0f} kB each ({e}); lower "
                "training.buffer_capacity to what the run collects (training.steps) or what memory holds"
            ) from None
        self.data = {
            "action": torch.zeros(*shape, *action.shape[1:], dtype=torch.float32),
            "reward": torch.zeros(shape, dtype=torch.float32),
            "terminated": torch.zeros(shape, dtype=torch.bool),
            "truncated": torch.zeros(shape, dtype=torch.bool),
            "done": torch.zeros(shape, dtype=torch.bool),
            "valid": torch.zeros(shape, dtype=torch.bool),
            "episode": torch.zeros(shape, dtype=torch.int64),
            "step": torch.zeros(shape, dtype=torch.int64),
            "priority": torch.zeros(shape, dtype=torch.float32),
        }

    def add(
        self,
        obs: Mapping[str, Any],
        action: Any,
        reward: Any,
        next_obs: Mapping[str, Any],
        terminated: Any,
        truncated: Any,
        valid: Any | None = None,
    ) -> None:
        """Write one vector step: every argument has a leading `n_envs` dimension.

        `obs` and `next_obs` are {batch key: (n_envs, ...)}; an image given as uint8 (n_envs, C, H, W) is kept
        so and sampled scaled to [0, 1], anything else is kept as float32. `next_obs` must be the real next
        observation (the final observation where an episode ended); `valid=False` marks envs whose row is not
        a transition.
        """
        obs = {k: _as_stored(v) for k, v in obs.items()}
        next_obs = {k: _as_stored(v) for k, v in next_obs.items()}
        action = _as_tensor(action, torch.float32)
        if action.ndim == 1:
            action = action.unsqueeze(-1)
        if not self.data:
            self._allocate(obs, action)
        terminated = _as_tensor(terminated, torch.bool)
        truncated = _as_tensor(truncated, torch.bool)
        valid = torch.ones(self.n_envs, dtype=torch.bool) if valid is None else _as_tensor(valid, torch.bool)
        done = terminated | truncated
        r = self.pos
        for k in self.obs:
            if obs[k].dtype == torch.uint8 and self.obs[k].dtype == torch.float32:
                # Loaded from a buffer saved when images were kept as float32 k / 255 (`load_state_dict` keeps
                # them so): now that images come as uint8, their k, which samples the same numbers.
                self.obs[k], self.next_obs[k] = _unscale_(self.obs[k]), _unscale_(self.next_obs[k])
            self.obs[k][r] = obs[k]
            self.next_obs[k][r] = next_obs[k]
        d = self.data
        d["action"][r] = action
        d["reward"][r] = _as_tensor(reward, torch.float32)
        d["terminated"][r], d["truncated"][r], d["done"][r] = terminated, truncated, done
        d["valid"][r] = valid
        d["episode"][r] = self._cur_episode
        d["step"][r] = self._cur_step
        d["priority"][r] = self.max_priority
        # An invalid row belongs to no episode: it neither advances the step count nor ends an episode.
        ended = done & valid
        self._cur_step = torch.where(valid, self._cur_step + 1, self._cur_step)
        self._cur_step[ended] = 0
        self._cur_episode += ended.long()
        self.pos = (self.pos + 1) % self.rows
        self.full = self.full or self.pos == 0

    def add_env_step(
        self,
        obs: Mapping[str, Any],
        action: Any,
        step_result: tuple[Any, Any, Any, Any, Mapping[str, Any]],
        autoreset_mode: AutoresetMode,
        to_batch: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> None:
        """Store what `env.step(action)` returned from `obs` (`step_result`: its `(next_obs, reward,
        terminated, truncated, info)`), handling the env's autoreset mode (see the module docstring).

        `obs`/`next_obs` are raw env observations; `to_batch` (e.g. `observation_to_batch`) turns them into
        {batch key: tensor}, except their images, which are stored as uint8 (`_to_stored`). Without it they must
        already be such dicts.
        """
        next_obs, reward, terminated, truncated, info = step_result
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        valid = np.ones(self.n_envs, dtype=bool)
        if autoreset_mode == AutoresetMode.SAME_STEP:
            next_obs = final_observations(next_obs, info)
        elif autoreset_mode == AutoresetMode.NEXT_STEP:
            # The step after an episode end is gymnasium's reset step: not a transition.
            valid = ~self._autoreset_pending.numpy()
            self._autoreset_pending = torch.from_numpy((terminated | truncated) & valid)
        elif autoreset_mode != AutoresetMode.DISABLED:
            raise ValueError(f"unknown autoreset mode {autoreset_mode!r}")
        if to_batch is not None:
            obs, next_obs = _to_stored(obs, to_batch), _to_stored(next_obs, to_batch)
        self.add(obs, action, reward, next_obs, terminated, truncated, valid)

    def extend_episodes(self, obs: Mapping[str, Any], action: Any, reward: Any, episode_index: Any) -> int:
        """Append whole recorded episodes (a 1-env buffer only), e.g. demonstrations; return transitions added.

        Inputs are frame-aligned (N, ...) arrays sorted by episode: frame t of an episode gives the transition
        (obs_t, action_t, reward_t, obs_{t+1}). An episode's last frame has no recorded next observation and
        is dropped, so the episode's last stored transition did not end it: it is marked truncated
        (bootstrapping continues), never terminated.
        """
        if self.n_envs != 1:
            raise ValueError("extend_episodes needs a buffer with n_envs=1")
        obs = {k: _as_tensor(v, torch.float32) for k, v in obs.items()}
        action = _as_tensor(action, torch.float32)
        if action.ndim == 1:
            action = action.unsqueeze(-1)
        reward = _as_tensor(reward, torch.float32)
        ep = _as_tensor(episode_index, torch.int64)
        n = ep.shape[0]
        if n < 2:
            return 0
        # Keep frames whose successor belongs to the same episode.
        idx = (ep[1:] == ep[:-1]).nonzero().squeeze(1)
        truncated = torch.ones_like(idx, dtype=torch.bool)
        truncated[:-1] = ep[idx[1:]] != ep[idx[:-1]]
        terminated = torch.zeros_like(truncated)
        for i in range(idx.shape[0]):  # one row per transition keeps the episode bookkeeping in one place
            j = int(idx[i])
            self.add(
                {k: v[j : j + 1] for k, v in obs.items()},
                action[j : j + 1],
                reward[j : j + 1],
                {k: v[j + 1 : j + 2] for k, v in obs.items()},
                terminated[i : i + 1],
                truncated[i : i + 1],
            )
        return int(idx.shape[0])

    # ----------------------------------------------------------------- sampling
    def _valid_starts(self, rows: Tensor, envs: Tensor, horizon: int) -> Tensor:
        """Mask of candidate starts whose H rows are one written, valid, uninterrupted piece of one episode."""
        d = self.data
        end = (rows + horizon - 1) % self.rows
        ok = d["valid"][rows, envs] & d["valid"][end, envs]
        ok &= d["episode"][end, envs] == d["episode"][rows, envs]
        # Same episode and exactly H-1 steps apart: contiguous, and not wrapped into overwritten rows.
        ok &= d["step"][end, envs] == d["step"][rows, envs] + horizon - 1
        if not self.full:
            ok &= rows + horizon - 1 < self.pos
        return ok

    @property
    def prioritized(self) -> bool:
        """Whether starts are drawn by priority (`alpha > 0`)."""
        return self.alpha > 0

    def sample(self, batch_size: int, horizon: int = 1) -> dict[str, Tensor]:
        """Draw `batch_size` sub-trajectories of `horizon` transitions, uniformly over valid starts (with
        `alpha > 0`: by priority, see the module docstring).

        Returns (B = batch_size, H = horizon):
            obs keys        (B, H+1, *shape)  o_t .. o_{t+H}: the H observations, then the last next_obs
            "action"        (B, H, A)
            "next.reward", "next.terminated", "next.truncated", "next.done"   (B, H)
        and, with prioritised replay:
            "sample_weight" (B,)    importance weight, at most 1
            "replay_index"  (B, 2)  (row, env) of each start, for `update_priorities`
        """
        n_rows = self.filled_rows
        if n_rows < horizon or len(self) == 0:
            raise RuntimeError(f"replay buffer holds {len(self)} transitions, too few for horizon {horizon}")
        high = n_rows if self.full else n_rows - horizon + 1
        if not self.prioritized:

            def uniformly(n: int) -> tuple[Tensor, Tensor]:
                rows = torch.randint(0, high, (n,), generator=self.generator)
                return rows, torch.randint(0, self.n_envs, (n,), generator=self.generator)

            rows, envs = self._draw_valid_starts(batch_size, horizon, uniformly)
            return self.gather(rows, envs, horizon)
        # Drawn by priority among all rows and the invalid starts rejected: in proportion among the valid ones.
        strength = self.data["priority"][:high].pow(self.alpha).flatten()  # p**alpha, (high * n_envs,)

        def by_priority(n: int) -> tuple[Tensor, Tensor]:
            flat = torch.multinomial(strength, n, replacement=True, generator=self.generator)
            return flat // self.n_envs, flat % self.n_envs

        rows, envs = self._draw_valid_starts(batch_size, horizon, by_priority)
        # (N P)**-beta over the batch's largest: N and the sum over starts cancel out of the ratio.
        drawn = strength[rows * self.n_envs + envs]
        batch = self.gather(rows, envs, horizon)
        batch[SAMPLE_WEIGHT] = (drawn / drawn.min()).pow(-self.beta)
        batch[REPLAY_INDEX] = torch.stack([rows, envs], dim=1)
        return batch

    def _draw_valid_starts(
        self, batch_size: int, horizon: int, candidates: Callable[[int], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        """`batch_size` valid starts (rows, envs), each (B,), from `candidates(n)` by rejection."""
        chosen_rows, chosen_envs, n_found = [], [], 0
        for _ in range(_MAX_REJECTION_ROUNDS):
            need = batch_size - n_found
            # Oversample a little so one round usually suffices.
            rows, envs = candidates(need + need // 4 + 8)
            ok = self._valid_starts(rows, envs, horizon)
            rows, envs = rows[ok][:need], envs[ok][:need]
            chosen_rows.append(rows)
            chosen_envs.append(envs)
            n_found += rows.shape[0]
            if n_found == batch_size:
                return torch.cat(chosen_rows), torch.cat(chosen_envs)
        raise RuntimeError(
            f"could not find {batch_size} sub-trajectories of length {horizon} that stay inside one "
            "episode; are the episodes shorter than the horizon?"
        )

    def update_priorities(self, index: Tensor, priority: Tensor) -> None:
        """Set the priorities of the starts `index` (B, 2) of (row, env), as `sample` returned them, to
        `priority` (B,) (e.g. the policy's TD errors); rows marked -1 (not from this buffer) are skipped."""
        index, priority = index.cpu(), priority.detach().float().cpu()
        keep = index[:, 0] >= 0
        index, priority = index[keep], priority[keep] + _PRIORITY_EPS
        if priority.numel() == 0:
            return
        if not bool(torch.isfinite(priority).all()):
            raise ValueError("update_priorities got non-finite priorities; the loss they come from diverged")
        self.data["priority"][index[:, 0], index[:, 1]] = priority
        self.max_priority = max(self.max_priority, float(priority.max()))

    def gather(self, rows: Tensor, envs: Tensor, horizon: int) -> dict[str, Tensor]:
        """The sub-trajectories starting at (rows[i], envs[i]) (no validity check), laid out as in `sample`."""
        idx = (rows.unsqueeze(1) + torch.arange(horizon)) % self.rows  # (B, H)
        env_idx = envs.unsqueeze(1).expand_as(idx)
        batch: dict[str, Tensor] = {}
        for key in self.obs:
            seq = self.obs[key][idx, env_idx]  # (B, H, ...)
            last = self.next_obs[key][idx[:, -1], envs].unsqueeze(1)  # (B, 1, ...)
            obs = torch.cat([seq, last], dim=1)
            batch[key] = image_to_float(obs) if obs.dtype == torch.uint8 else obs
        d = self.data
        batch[ACTION] = d["action"][idx, env_idx]
        batch[NEXT_REWARD] = d["reward"][idx, env_idx]
        batch[NEXT_TERMINATED] = d["terminated"][idx, env_idx]
        batch[NEXT_TRUNCATED] = d["truncated"][idx, env_idx]
        batch[NEXT_DONE] = d["done"][idx, env_idx]
        return batch

    # ----------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue: the filled rows, write position and bookkeeping."""
        n = self.filled_rows
        return {
            "rows": self.rows,
            "n_envs": self.n_envs,
            "pos": self.pos,
            "full": self.full,
            "obs": {k: v[:n].clone() for k, v in self.obs.items()},
            "next_obs": {k: v[:n].clone() for k, v in self.next_obs.items()},
            "data": {k: v[:n].clone() for k, v in self.data.items()},
            "cur_episode": self._cur_episode.clone(),
            "cur_step": self._cur_step.clone(),
            "autoreset_pending": self._autoreset_pending.clone(),
            "generator": self.generator.get_state(),
            "max_priority": self.max_priority,
        }

    def start_episodes(self) -> None:
        """Every env starts a new episode outside `add` (reset by the caller, e.g. a resumed run's fresh
        episodes): the next transitions of an env whose episode was under way belong to a new episode, so
        that no sub-trajectory joins the two."""
        self._cur_episode += (self._cur_step > 0).long()
        self._cur_step.zero_()
        self._autoreset_pending.zero_()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict`: exactly into a buffer of the same shape (rows, n_envs), else (a branch
        with another `training.n_envs` or `buffer_capacity`) its transitions copied into this layout
        (`_relayout`).

        Images saved before they were kept as uint8 (float32 k / 255) are restored as they are, and sample
        as they did: the state does not tell them apart from other float32 entries (rows, n_envs, a, b, c).
        The first uint8 image `add` writes to such a key turns it into uint8 k.
        """
        if state["rows"] != self.rows or state["n_envs"] != self.n_envs:
            self._relayout(state)
            return
        self.pos, self.full = int(state["pos"]), bool(state["full"])

        def restore(saved: Mapping[str, Tensor], alloc: Callable[..., Tensor]) -> dict[str, Tensor]:
            out = {}
            for k, v in saved.items():
                full = alloc(self.rows, *v.shape[1:], dtype=v.dtype)
                full[: v.shape[0]] = v
                out[k] = full
            return out

        self.obs, self.next_obs, self.data = (
            restore(state["obs"], _unwritten),
            restore(state["next_obs"], _unwritten),
            restore(state["data"], torch.zeros),  # unwritten rows must read as not valid
        )
        self._cur_episode = state["cur_episode"].clone()
        self._cur_step = state["cur_step"].clone()
        self._autoreset_pending = state["autoreset_pending"].clone()
        self.generator.set_state(state["generator"])
        # Buffers saved before priorities were kept: every stored start as likely as any other.
        if self.data and "priority" not in self.data:
            self.data["priority"] = torch.ones(self.rows, self.n_envs)
        self.max_priority = float(state.get("max_priority", 1.0))

    def _relayout(self, state: Mapping[str, Any]) -> None:
        """Copy the transitions of a saved buffer of another shape into this one, as sub-trajectories of
        the same episodes.

        Saved env `e`'s valid transitions, oldest first, go to env `e % n_envs` of this buffer, after those
        of the saved envs before it that share that env; where they do not all fit, each saved env keeps its
        newest `rows // ceil(saved envs / n_envs)`. The columns end on the same row (the newest transitions
        last, shorter columns start with unwritten rows). Episodes are renumbered so that no two share a
        number in one env, every env starts a new episode at its next `add` (the caller resets its envs),
        and the priorities and the sampling generator are carried over.
        """
        saved, saved_envs, pos = state["data"], int(state["n_envs"]), int(state["pos"])
        self.generator.set_state(state["generator"])
        self.max_priority = float(state.get("max_priority", 1.0))
        if not saved:  # nothing was ever added
            return
        filled = saved["valid"].shape[0]
        oldest_first = torch.arange(filled)
        if state["full"]:
            oldest_first = torch.cat([oldest_first[pos:], oldest_first[:pos]])
        keep = self.rows // -(-saved_envs // self.n_envs)
        columns: list[list[tuple[int, Tensor]]] = [[] for _ in range(self.n_envs)]
        for e in range(saved_envs):
            rows = oldest_first[saved["valid"][oldest_first, e]]
            columns[e % self.n_envs].append((e, rows[rows.numel() - keep :] if keep else rows[:0]))
        length = max(sum(rows.numel() for _, rows in column) for column in columns)

        def empty(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
            return {k: v.new_zeros(self.rows, self.n_envs, *v.shape[2:]) for k, v in tensors.items()}

        self.obs, self.next_obs, self.data = empty(state["obs"]), empty(state["next_obs"]), empty(saved)
        if self.data and "priority" not in self.data:  # saved before priorities were kept
            self.data["priority"] = torch.ones(self.rows, self.n_envs)
        for j, column in enumerate(columns):
            row = length - sum(rows.numel() for _, rows in column)
            episodes_before = 0
            for e, rows in column:
                span = slice(row, row + rows.numel())
                for mine, theirs in (
                    (self.obs, state["obs"]),
                    (self.next_obs, state["next_obs"]),
                    (self.data, saved),
                ):
                    for k, v in theirs.items():
                        mine[k][span, j] = v[rows, e]
                if rows.numel():
                    episode = saved["episode"][rows, e]
                    self.data["episode"][span, j] = episode - episode.min() + episodes_before
                    episodes_before += int(episode.max() - episode.min()) + 1
                row = span.stop
            self._cur_episode[j] = episodes_before
        self._cur_step.zero_()
        self._autoreset_pending.zero_()
        self.pos, self.full = length % self.rows, length == self.rows
