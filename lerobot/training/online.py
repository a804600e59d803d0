"""Online off-policy training of an `OnlinePolicy` (TD-MPC) from `n_envs` vector envs, SB3 schedule semantics.

The loop, top to bottom:

    repeat until `training.steps` transitions have been collected:
        collect: `train_freq` vector steps; each adds `n_envs` transitions to the replay buffer. Actions are
                 uniform random over the action bounds while fewer than `learning_starts` transitions have been
                 collected, the policy's (with `explore` on) afterwards.
        update:  `UpdateSchedule.updates_after_collection` gradient steps (`TrainStep`) on sub-trajectories of
                 `policy.replay_horizon` transitions from the buffer, each followed by `policy.update_target()`.
        every `log_freq` / `save_freq` / `eval.freq` transitions: log, checkpoint, evaluate (`TrainingLoop`).

Counting (SB3 semantics, all counts in transitions over all envs unless said otherwise):
- `training.steps`: total env transitions (n_envs per vector step), the x axis of every log.
- `training.train_freq`: vector steps per collection (train_freq * n_envs transitions).
- `training.gradient_steps`: updates after each collection; -1 = as many as transitions just collected.
- `training.utd_ratio` (optional, takes precedence over `gradient_steps` when set): updates per collected
  transition, accumulated with a fractional carry (0.5 with n_envs=1, train_freq=1 gives one update every
  second collection; 2.0 with n_envs=4 gives 8 per collection).
- `training.learning_starts`: random actions for every vector step taken while fewer transitions than this
  have been collected; updates begin after the first collection that ends with more than this many.

Autoreset: the train envs use `AutoresetMode.SAME_STEP`, so every vector step is a real transition for every env;
the replay buffer stores `info["final_obs"]` as the next observation of an episode's last step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from omegaconf import DictConfig
from safetensors.torch import load_file

from lerobot.config import ConfigError, EnvConfig, env_config
from lerobot.constants import ACTION, EPISODE_INDEX, NEXT_REWARD
from lerobot.envs import make_env, observation_to_batch
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.training.checkpoint import (
    MODEL_FILE,
    get_rng_state,
    load_training_state,
    save_checkpoint,
    set_rng_state,
)
from lerobot.training.common import resolve_device, set_seed, setup_run
from lerobot.training.loop import TrainingLoop, TrainStep
from lerobot.training.replay_buffer import ReplayBuffer, sample_mixed

log = logging.getLogger(__name__)


@dataclass
class UpdateSchedule:
    """When to act randomly and how many gradient updates follow each collection (pure bookkeeping)."""

    n_envs: int
    train_freq: int = 1
    gradient_steps: int = 1
    learning_starts: int = 0
    utd_ratio: float | None = None
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

    @classmethod
    def from_config(cls, training_cfg: Any) -> UpdateSchedule:
        """The schedule of the `training` config section."""
        return cls(
            n_envs=training_cfg.n_envs,
            train_freq=training_cfg.train_freq,
            gradient_steps=training_cfg.gradient_steps,
            learning_starts=training_cfg.learning_starts,
            utd_ratio=training_cfg.utd_ratio,
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
        if self.utd_ratio is not None:
            self._carry += self.utd_ratio * collected
            n = int(self._carry + 1e-9)
            self._carry -= n
            return n
        return self.gradient_steps if self.gradient_steps >= 0 else collected

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


def load_demonstrations(cfg: DictConfig, env_cfg: EnvConfig, obs_keys: list[str]) -> ReplayBuffer:
    """A 1-env replay buffer holding the transitions of the training split of the env's demonstrations."""
    from lerobot.datasets import make_dataset

    dataset = make_dataset(cfg.dataset, env_cfg, delta_timestamps=None, split="train", keys=[NEXT_REWARD])
    frames = dataset.__getitems__(np.arange(len(dataset)))  # every frame at once, sorted by episode
    buffer = ReplayBuffer(capacity=len(dataset), n_envs=1, seed=cfg.seed + 1)
    n = buffer.extend_episodes(
        {k: frames[k] for k in obs_keys}, frames[ACTION], frames[NEXT_REWARD], frames[EPISODE_INDEX]
    )
    log.info("offline replay buffer: %d demonstration transitions", n)
    return buffer


class _EpisodeStats:
    """Returns and lengths of the episodes the train envs finish."""

    def __init__(self, n_envs: int):
        self.ret = np.zeros(n_envs)
        self.len = np.zeros(n_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []

    def step(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.ret += reward
        self.len += 1
        for i in np.flatnonzero(done):
            self.finished_returns.append(float(self.ret[i]))
            self.finished_lengths.append(int(self.len[i]))
        self.ret[done] = 0.0
        self.len[done] = 0

    def pop(self) -> dict[str, float]:
        if not self.finished_returns:
            return {}
        out = {
            "episode_return": float(np.mean(self.finished_returns)),
            "episode_length": float(np.mean(self.finished_lengths)),
            "episodes_finished": float(len(self.finished_returns)),
        }
        self.finished_returns, self.finished_lengths = [], []
        return out


def train_online(cfg: DictConfig, progress: bool = True) -> Path:
    """Train an `OnlinePolicy` (TD-MPC) as configured; return the run directory.

    `cfg` is the validated root config. With `training.resume=true` and `output_dir` pointing at an earlier
    run, continues from its last checkpoint: weights, optimiser, schedule, counters and random states, and the
    replay buffer when it was saved (`training.save_buffer`). Without a saved buffer, updates wait until
    `learning_starts` new transitions (collected by the restored policy) are in the buffer. Env states are not
    saved: a resumed run starts fresh episodes.
    """
    run_dir, resume_from = setup_run(cfg)
    tcfg = cfg.training
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    if tcfg.batch_size is not None:
        policy_cfg.batch_size = tcfg.batch_size
    if not 0.0 <= tcfg.offline_ratio <= 1.0:
        raise ConfigError(f"training.offline_ratio={tcfg.offline_ratio} must be in [0, 1]")
    device = resolve_device(cfg.device)
    set_seed(cfg.seed)
    n_envs = tcfg.n_envs

    policy = make_policy(policy_cfg).to(device)
    if not isinstance(policy, OnlinePolicy):
        raise ConfigError(
            f"policy {policy_cfg.name!r} cannot learn online: {type(policy).__name__} is not an OnlinePolicy "
            "(lerobot/policies/online_policy.py); its config's training_mode must be 'offline'"
        )
    if policy_cfg.use_ema:
        raise ConfigError("policy.use_ema=true: the online trainer keeps no EMA weights (see update_target)")
    horizon = policy.replay_horizon
    schedule = UpdateSchedule.from_config(tcfg)
    update = TrainStep(policy, policy_cfg, tcfg, total_updates=schedule.count_updates(tcfg.steps))
    buffer = ReplayBuffer(tcfg.buffer_capacity, n_envs, seed=cfg.seed)
    demos = None
    if tcfg.offline_ratio > 0:
        demos = load_demonstrations(cfg, env_cfg, sorted(policy_cfg.input_features))

    transitions = updates = 0
    refill_needed = 0
    # Wall time spent collecting and updating (evaluation and checkpoints excluded), over the whole run.
    train_time_s = 0.0
    if resume_from is not None:
        policy.load_state_dict(load_file(resume_from / MODEL_FILE))
        state = load_training_state(resume_from)
        update.optimizer.load_state_dict(state["optimizer"])
        update.scheduler.load_state_dict(state["lr_scheduler"])
        schedule.load_state_dict(state["schedule"])
        transitions, updates = state["transitions"], state["updates"]
        train_time_s = float(state.get("train_time_s", 0.0))
        set_rng_state(state["rng"])
        if "replay_buffer" in state:
            buffer.load_state_dict(state["replay_buffer"])
        else:
            refill_needed = tcfg.learning_starts
        log.info("resumed from %s at %d transitions (%d updates)", resume_from, transitions, updates)

    envs = make_env(
        env_cfg,
        n_envs,
        use_async=tcfg.use_async_envs,
        autoreset_mode=AutoresetMode.SAME_STEP,
        render_mode=None,
    )
    resumed = resume_from is not None
    with (
        contextlib.closing(envs),
        TrainingLoop(cfg, run_dir, start=transitions, resumed=resumed, unit="tr", progress=progress) as loop,
    ):
        # Seeds derived from the transition count, so a resumed run does not replay the episodes it saw.
        envs.action_space.seed(cfg.seed + transitions)
        obs, _ = envs.reset(seed=[cfg.seed + transitions + i for i in range(n_envs)])
        policy.reset()
        policy.set_noise_seed(cfg.seed + transitions)
        episodes = _EpisodeStats(n_envs)
        sums: dict[str, float] = defaultdict(float)  # per-update outputs summed since the last log
        window_updates = 0
        window_start = transitions
        collect_s = update_s = 0.0
        while loop.running:
            t_collect = time.perf_counter()
            policy.eval()
            policy.explore = True
            for _ in range(tcfg.train_freq):
                if schedule.random_actions(transitions):
                    action = envs.action_space.sample()
                else:
                    action = policy.select_action(observation_to_batch(obs, device)).numpy()
                next_obs, reward, terminated, truncated, info = envs.step(action)
                buffer.add_env_step(
                    obs, action, reward, next_obs, terminated, truncated, info, AutoresetMode.SAME_STEP,
                    to_batch=observation_to_batch,
                )  # fmt: skip
                done = np.logical_or(terminated, truncated)
                episodes.step(np.asarray(reward, dtype=np.float64), done)
                if done.any():
                    # New episodes start in these slots: no history or warm-started plan from the old ones.
                    policy.reset(np.flatnonzero(done))
                obs = next_obs
                transitions += n_envs
            policy.explore = False
            t_update = time.perf_counter()
            collect_s += t_update - t_collect

            n_updates = schedule.updates_after_collection(transitions)
            if len(buffer) < refill_needed or buffer.filled_rows < horizon:
                n_updates = 0
            for _ in range(n_updates):
                batch = sample_mixed(buffer, demos, policy_cfg.batch_size, horizon, tcfg.offline_ratio)
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                output = update(batch, where=f"update {updates + 1} ({transitions} transitions)")
                policy.update_target()
                updates += 1
                window_updates += 1
                for k, v in output.items():
                    sums[k] += float(v)
            update_s += time.perf_counter() - t_update
            train_time_s += time.perf_counter() - t_collect
            due = loop.advance(transitions - loop.step)

            if due.log:
                window = transitions - window_start
                metrics = {k: v / window_updates for k, v in sums.items()} if window_updates else {}
                metrics.update(episodes.pop())
                metrics.update(
                    lr=update.lr,
                    updates=updates,
                    updates_per_transition=window_updates / max(window, 1),
                    update_s=update_s / max(window_updates, 1),
                    collect_s=collect_s / max(window / n_envs, 1),
                    env_steps_per_s=window / max(collect_s + update_s, 1e-9),
                    buffer_size=len(buffer),
                    train_time_s=train_time_s,
                )
                loop.log(metrics)
                sums.clear()
                window_updates = 0
                window_start = transitions
                collect_s = update_s = 0.0
            if due.checkpoint:
                training_state = {
                    "optimizer": update.optimizer.state_dict(),
                    "lr_scheduler": update.scheduler.state_dict(),
                    "schedule": schedule.state_dict(),
                    "transitions": transitions,
                    "updates": updates,
                    "rng": get_rng_state(),
                    "train_time_s": train_time_s,
                }
                if tcfg.save_buffer:
                    training_state["replay_buffer"] = buffer.state_dict()
                save_checkpoint(run_dir, transitions, policy, cfg, training_state)
            if due.eval:
                loop.evaluate(policy)
                # The evaluation envs went through the policy: clear its per-env state and reseed its noise
                # for the train envs.
                policy.reset()
                policy.set_noise_seed(cfg.seed + transitions)
    return run_dir
