"""Online off-policy training (TD-MPC) from `n_envs` vector envs, with Stable-Baselines3's schedule semantics.

The loop, top to bottom:

    repeat until `training.steps` transitions have been collected:
        collect: `train_freq` vector steps; each adds `n_envs` transitions to the replay buffer. Actions are
                 uniform random over the action bounds while fewer than `learning_starts` transitions have been
                 collected, planned by the policy (with exploration noise) afterwards.
        update:  `UpdateSchedule.updates_after_collection` gradient steps on sub-trajectories from the buffer,
                 each followed by the policy's EMA target update.
        every `log_freq` / `eval.freq` / `save_freq` transitions: log, evaluate, checkpoint.

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

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from omegaconf import DictConfig
from safetensors.torch import load_file
from tqdm import tqdm

from lerobot.config import ConfigError, EnvConfig, env_config
from lerobot.constants import ACTION, EPISODE_INDEX, NEXT_REWARD
from lerobot.envs import make_env, observation_to_batch
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.training.checkpoint import (
    MODEL_FILE,
    get_rng_state,
    load_training_state,
    save_checkpoint,
    set_rng_state,
)
from lerobot.training.common import (
    TrainingDivergedError,
    build_optimizer,
    resolve_device,
    run_evaluation,
    set_seed,
    setup_run,
)
from lerobot.training.logger import MetricsLogger
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
        return cls(
            n_envs=training_cfg.n_envs,
            train_freq=training_cfg.train_freq,
            gradient_steps=training_cfg.gradient_steps,
            learning_starts=training_cfg.learning_starts,
            utd_ratio=training_cfg.utd_ratio,
        )

    @property
    def transitions_per_collection(self) -> int:
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
        return {"carry": self._carry}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._carry = float(state["carry"])


def _crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]."""
    return every > 0 and after // every > before // every


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
    """Train an online policy (TD-MPC) as configured; return the run directory.

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
    horizon = getattr(policy_cfg, "horizon", 1)

    policy = make_policy(policy_cfg).to(device)
    schedule = UpdateSchedule.from_config(tcfg)
    optimizer, lr_scheduler = build_optimizer(policy, policy_cfg, schedule.count_updates(tcfg.steps))
    buffer = ReplayBuffer(tcfg.buffer_capacity, n_envs, seed=cfg.seed)
    offline = None
    if tcfg.offline_ratio > 0:
        offline = load_demonstrations(cfg, env_cfg, sorted(policy_cfg.input_features))

    transitions = updates = 0
    refill_needed = 0
    if resume_from is not None:
        policy.load_state_dict(load_file(resume_from / MODEL_FILE))
        state = load_training_state(resume_from)
        optimizer.load_state_dict(state["optimizer"])
        lr_scheduler.load_state_dict(state["lr_scheduler"])
        schedule.load_state_dict(state["schedule"])
        transitions, updates = state["transitions"], state["updates"]
        set_rng_state(state["rng"])
        if "replay_buffer" in state:
            buffer.load_state_dict(state["replay_buffer"])
        else:
            refill_needed = tcfg.learning_starts
        log.info("resumed from %s at %d transitions (%d updates)", resume_from, transitions, updates)
    logger = MetricsLogger(run_dir, cfg, resume_step=transitions if resume_from is not None else None)

    envs = make_env(
        env_cfg,
        n_envs,
        use_async=tcfg.use_async_envs,
        autoreset_mode=AutoresetMode.SAME_STEP,
        render_mode=None,
    )
    # Seeds derived from the transition count, so a resumed run does not replay the episodes it saw.
    envs.action_space.seed(cfg.seed + transitions)
    obs, _ = envs.reset(seed=[cfg.seed + transitions + i for i in range(n_envs)])
    policy.reset()
    if hasattr(policy, "set_planner_seed"):
        policy.set_planner_seed(cfg.seed + transitions)

    def to_batch(o: Any) -> dict[str, torch.Tensor]:
        return observation_to_batch(o, "cpu")

    episodes = _EpisodeStats(n_envs)
    sums: dict[str, float] = defaultdict(float)
    n_logged_updates = 0
    collect_s = update_s = 0.0  # since the last log
    window_transitions = transitions
    # Wall time spent collecting and updating (evaluation and checkpoints excluded), over the whole run.
    train_time_s = 0.0 if resume_from is None else float(state.get("train_time_s", 0.0))
    last_eval = -1
    # bf16 autocast for the updates (planning stays fp32), as the offline trainer does.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=tcfg.use_amp)
    pbar = tqdm(total=tcfg.steps, initial=transitions, unit="tr", disable=not progress, dynamic_ncols=True)

    def checkpoint(step: int) -> Path:
        training_state = {
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "schedule": schedule.state_dict(),
            "transitions": step,
            "updates": updates,
            "rng": get_rng_state(),
            "train_time_s": train_time_s,
        }
        if tcfg.save_buffer:
            training_state["replay_buffer"] = buffer.state_dict()
        return save_checkpoint(run_dir, step, policy, cfg, training_state)

    try:
        while transitions < tcfg.steps:
            before = transitions
            # ---------------------------------------------------------- collect
            t0 = t_collect = time.perf_counter()
            policy.eval()
            policy.explore = True
            for _ in range(tcfg.train_freq):
                if schedule.random_actions(transitions):
                    action = envs.action_space.sample()
                else:
                    obs_batch = observation_to_batch(obs, device)
                    action = policy.select_action(obs_batch).cpu().numpy()
                next_obs, reward, terminated, truncated, info = envs.step(action)
                buffer.add_env_step(
                    obs,
                    action,
                    reward,
                    next_obs,
                    terminated,
                    truncated,
                    info,
                    AutoresetMode.SAME_STEP,
                    to_batch,
                )
                done = np.logical_or(terminated, truncated)
                episodes.step(np.asarray(reward, dtype=np.float64), done)
                if done.any():
                    # A new episode starts in these slots: no observation history or warm-started plan
                    # from the old one.
                    policy.reset(np.flatnonzero(done))
                obs = next_obs
                transitions += n_envs
            policy.explore = False
            collect_s += time.perf_counter() - t0

            # ---------------------------------------------------------- update
            t0 = time.perf_counter()
            n_updates = schedule.updates_after_collection(transitions)
            if len(buffer) < refill_needed or buffer.filled_rows < horizon:
                n_updates = 0
            if n_updates > 0:
                policy.train()
            for _ in range(n_updates):
                batch = sample_mixed(buffer, offline, policy_cfg.batch_size, horizon, tcfg.offline_ratio)
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with autocast:
                    out = policy.forward(batch)
                loss = out["loss"]
                if not torch.isfinite(loss):
                    raise TrainingDivergedError(
                        f"loss is {loss.item()} at update {updates} ({transitions} transitions)"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), tcfg.grad_clip_norm)
                optimizer.step()
                lr_scheduler.step()
                policy.update_target()
                updates += 1
                n_logged_updates += 1
                for k, v in out.items():
                    sums[k] += float(v.detach())
                sums["grad_norm"] += float(grad_norm)
            update_s += time.perf_counter() - t0
            train_time_s += time.perf_counter() - t_collect
            pbar.update(transitions - before)

            # ---------------------------------------------------------- log / eval / save
            if _crossed(before, transitions, tcfg.log_freq) or transitions >= tcfg.steps:
                elapsed = collect_s + update_s
                metrics = {k: v / n_logged_updates for k, v in sums.items()} if n_logged_updates else {}
                metrics.update(episodes.pop())
                metrics.update(
                    {
                        "lr": optimizer.param_groups[0]["lr"],
                        "updates": updates,
                        "updates_per_transition": n_logged_updates / max(transitions - window_transitions, 1),
                        "update_s": update_s / max(n_logged_updates, 1),
                        "collect_s": collect_s / max((transitions - window_transitions) / n_envs, 1),
                        "env_steps_per_s": (transitions - window_transitions) / max(elapsed, 1e-9),
                        "buffer_size": len(buffer),
                        "train_time_s": train_time_s,
                    }
                )
                logger.log(transitions, metrics)
                if "loss" in metrics:
                    pbar.set_postfix(
                        loss=f"{metrics['loss']:.3g}", ret=metrics.get("episode_return", float("nan"))
                    )
                sums.clear()
                n_logged_updates = 0
                collect_s = update_s = 0.0
                window_transitions = transitions
            if _crossed(before, transitions, cfg.eval.freq):
                _evaluate(cfg, policy, transitions, run_dir, logger)
                last_eval = transitions
                if hasattr(policy, "set_planner_seed"):
                    # Fresh planner noise for the train envs (evaluation reset the generators).
                    policy.set_planner_seed(cfg.seed + transitions)
            if _crossed(before, transitions, tcfg.save_freq) and transitions < tcfg.steps:
                checkpoint(transitions)
        if cfg.eval.freq > 0 and last_eval != transitions:
            _evaluate(cfg, policy, transitions, run_dir, logger)
        checkpoint(transitions)
    finally:
        pbar.close()
        envs.close()
        logger.close()
    return run_dir


def _evaluate(cfg: DictConfig, policy, step: int, run_dir: Path, logger: MetricsLogger) -> dict:
    """Evaluate without exploration noise, then clear the policy's per-env state for the train envs again."""
    policy.explore = False
    info = run_evaluation(cfg, policy, step, run_dir, logger)
    policy.reset()
    agg = info["aggregated"]
    log.info(
        "eval at %d transitions: avg_sum_reward=%.2f pc_success=%.1f",
        step,
        agg["avg_sum_reward"],
        agg["pc_success"],
    )
    return info
