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
- `training.initial_updates`: extra updates made at once after that first collection, on the random data
  alone (TD-MPC makes as many as it took random steps).
- `training.per_alpha` / `per_beta`: prioritised replay (0: uniform); after each update the policy's
  per-sample priorities are written back to the buffer.

Autoreset: the train envs use `AutoresetMode.SAME_STEP`, so every vector step is a real transition for every env;
the replay buffer stores `info["final_obs"]` as the next observation of an episode's last step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from omegaconf import DictConfig

from lerobot import distributed
from lerobot.checkpoints.run import save_checkpoint
from lerobot.config import EnvConfig, PolicyConfig, env_config
from lerobot.constants import ACTION, EPISODE_INDEX, NEXT_REWARD, REPLAY_INDEX, SAMPLE_PRIORITY
from lerobot.envs import make_env, observation_to_batch
from lerobot.errors import ConfigError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policy_registry import make_policy
from lerobot.rollout import act
from lerobot.training.guard import DivergenceGuard
from lerobot.training.progress import TrainingLoop
from lerobot.training.replay_buffer import ReplayBuffer, sample_mixed
from lerobot.training.run_dir import check_training_data, run_directory
from lerobot.training.update import LogWindow, TrainStep, restore, to_device

log = logging.getLogger(__name__)


@dataclass
class UpdateSchedule:
    """When to act randomly and how many gradient updates follow each collection (pure bookkeeping)."""

    n_envs: int
    train_freq: int = 1
    gradient_steps: int = 1
    learning_starts: int = 0
    utd_ratio: float | None = None
    initial_updates: int = 0
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
        if self.initial_updates < 0:
            raise ConfigError(f"training.initial_updates={self.initial_updates} must be >= 0")

    @classmethod
    def from_config(cls, training_cfg: Any) -> UpdateSchedule:
        """The schedule of the `training` config section."""
        return cls(
            n_envs=training_cfg.n_envs,
            train_freq=training_cfg.train_freq,
            gradient_steps=training_cfg.gradient_steps,
            learning_starts=training_cfg.learning_starts,
            utd_ratio=training_cfg.utd_ratio,
            initial_updates=training_cfg.initial_updates,
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
        # The first collection past learning_starts: a stateless test, so a resumed run never repeats it.
        first = self.initial_updates if transitions_so_far - collected <= self.learning_starts else 0
        if self.utd_ratio is not None:
            self._carry += self.utd_ratio * collected
            n = int(self._carry + 1e-9)
            self._carry -= n
            return first + n
        return first + (self.gradient_steps if self.gradient_steps >= 0 else collected)

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


@dataclass
class Counts:
    """How far an online run has got; saved in its checkpoints."""

    transitions: int = 0
    updates: int = 0
    # Wall time spent collecting and updating (evaluation and checkpoints excluded), over the whole run.
    train_time_s: float = 0.0


class Collector:
    """The train envs and their current observations: steps them and stores the transitions in `buffer`.

    The envs autoreset in the same step (`AutoresetMode.SAME_STEP`), so every vector step is a real transition
    for every env. Actions are uniform random while `schedule.random_actions` says so, the policy's (with
    `explore` on, through the acting step `lerobot.rollout.act`) afterwards; a NaN or infinite one stops
    the run before it reaches an env (it would poison the env's state and the replay buffer). `episodes`
    gathers the returns and lengths of the episodes the envs finish.
    """

    # What the message of a non-finite action advises.
    NON_FINITE_ADVICE = (
        "The policy diverged: resume from an earlier checkpoint with a lower policy.optimizer_lr"
    )

    def __init__(
        self,
        env_cfg: EnvConfig,
        n_envs: int,
        use_async: bool,
        policy: OnlinePolicy,
        buffer: ReplayBuffer,
        schedule: UpdateSchedule,
        device: torch.device,
    ):
        self.envs = make_env(
            env_cfg, n_envs, use_async=use_async, autoreset_mode=AutoresetMode.SAME_STEP, render_mode=None
        )
        self.n_envs = n_envs
        self.policy = policy
        self.buffer = buffer
        self.schedule = schedule
        self.device = device
        self.obs: dict[str, np.ndarray] = {}
        self.episodes = _EpisodeStats(n_envs)

    def start(self, seed: int) -> None:
        """Start fresh episodes in every env: env `i` is reset with `seed + i`; actions and noise are reseeded."""
        self.envs.action_space.seed(seed)
        self.obs, _ = self.envs.reset(seed=[seed + i for i in range(self.n_envs)])
        self.reset_policy(seed)

    def reset_policy(self, seed: int) -> None:
        """Clear the policy's per-env state (history, warm-started plans) and reseed its exploration noise."""
        self.policy.reset()
        self.policy.set_noise_seed(seed)

    def collect(self, transitions: int) -> int:
        """Take `train_freq` vector steps, `transitions` having been collected before; return the new total."""

        def describe_slot(slot: int) -> str:  # read when an action is refused: the count at that step
            return f"train env slot {slot} after {transitions} transitions"

        self.policy.eval()
        self.policy.explore = True
        try:
            for _ in range(self.schedule.train_freq):
                self.policy.set_progress(transitions)
                if self.schedule.random_actions(transitions):
                    action = self.envs.action_space.sample()
                else:
                    action = act(self.policy, self.obs, self.device, describe_slot, self.NON_FINITE_ADVICE)
                next_obs, reward, terminated, truncated, info = self.envs.step(action)
                self.buffer.add_env_step(
                    self.obs, action, reward, next_obs, terminated, truncated, info, AutoresetMode.SAME_STEP,
                    to_batch=observation_to_batch,
                )  # fmt: skip
                done = np.logical_or(terminated, truncated)
                self.episodes.step(np.asarray(reward, dtype=np.float64), done)
                if done.any():
                    # New episodes start in these slots: no history or warm-started plan from the old ones.
                    self.policy.reset(np.flatnonzero(done))
                self.obs = next_obs
                transitions += self.n_envs
        finally:
            self.policy.explore = False  # evaluation and checkpoints never see exploration on
        return transitions

    def close(self) -> None:
        """Close the train envs."""
        self.envs.close()


def make_online_policy(policy_cfg: PolicyConfig, device: torch.device) -> OnlinePolicy:
    """The configured policy on `device`; a config error when it cannot learn online."""
    policy = make_policy(policy_cfg).to(device)
    if not isinstance(policy, OnlinePolicy):
        raise ConfigError(
            f"policy {policy_cfg.name!r} cannot learn online: {type(policy).__name__} is not an OnlinePolicy "
            "(lerobot/policies/online_policy.py); its config's training_mode must be 'offline'"
        )
    if policy_cfg.use_ema:
        raise ConfigError("policy.use_ema=true: the online trainer keeps no EMA weights (see update_target)")
    return policy


def checkpoint_state(
    update: TrainStep, schedule: UpdateSchedule, counts: Counts, buffer: ReplayBuffer | None
) -> dict[str, Any]:
    """What `load_checkpoint_state` needs to continue the run; `buffer` is saved unless None."""
    state = {
        **update.state_dict(),
        "schedule": schedule.state_dict(),
        "transitions": counts.transitions,
        "updates": counts.updates,
        "rng": distributed.get_rng_state(),
        "train_time_s": counts.train_time_s,
    }
    if buffer is not None:
        state["replay_buffer"] = buffer.state_dict()
    return state


def save(
    run_dir: Path, policy: OnlinePolicy, cfg: DictConfig, state: dict[str, Any], data: dict[str, Any] | None
) -> None:
    """Checkpoint the run at its transition count: the policy's weights, `state` (`checkpoint_state`) and
    the fingerprint of the demonstrations (`data`) when it reads some."""
    save_checkpoint(run_dir, state["transitions"], policy, cfg, state, data_fingerprint=data)


def load_checkpoint_state(
    ckpt_dir: Path, update: TrainStep, schedule: UpdateSchedule, buffer: ReplayBuffer
) -> Counts:
    """Load the checkpoint in `ckpt_dir` (`checkpoint_state`) into the run's objects and the global random
    states; return its counts.

    The replay buffer is restored when the checkpoint holds one, else `buffer` stays empty.
    """
    state = restore(ckpt_dir, update)
    schedule.load_state_dict(state["schedule"])
    counts = Counts(state["transitions"], state["updates"], float(state.get("train_time_s", 0.0)))
    distributed.set_rng_state(state["rng"])
    if "replay_buffer" in state:
        buffer.load_state_dict(state["replay_buffer"])
    log.info("resumed from %s at %d transitions (%d updates)", ckpt_dir, counts.transitions, counts.updates)
    return counts


def train_online(cfg: DictConfig, policy_cfg: PolicyConfig, progress: bool = True) -> Path:
    """Train an `OnlinePolicy` (TD-MPC) as configured; return the run directory.

    `cfg` is the validated root config, `policy_cfg` its policy section built (`make_policy_config`).
    With `training.resume=true` and `output_dir` pointing at an earlier
    run, continues from its last checkpoint: weights, optimiser, schedule, counters and random states, and the
    replay buffer when it was saved (`training.save_buffer`). Without a saved buffer, updates wait until
    `learning_starts` new transitions (collected by the restored policy) are in the buffer. Env states are not
    saved: a resumed run starts fresh episodes.
    """
    # Locked until training ends (`run_directory`).
    with run_directory(cfg) as (run_dir, resume_from):
        tcfg = cfg.training
        env_cfg = env_config(cfg)
        # As offline: the policy's config stays as validation built it.
        batch_size = tcfg.batch_size or policy_cfg.batch_size
        if not 0.0 <= tcfg.offline_ratio <= 1.0:
            raise ConfigError(f"training.offline_ratio={tcfg.offline_ratio} must be in [0, 1]")
        if tcfg.per_alpha < 0:
            raise ConfigError(f"training.per_alpha={tcfg.per_alpha} must be >= 0 (0: uniform replay)")
        if not 0.0 <= tcfg.per_beta <= 1.0:
            raise ConfigError(
                f"training.per_beta={tcfg.per_beta} must be in [0, 1] (1: full bias correction)"
            )
        device = distributed.resolve_device(cfg.device)
        distributed.set_seed(cfg.seed)
        policy = make_online_policy(policy_cfg, device)
        horizon = policy.replay_horizon
        schedule = UpdateSchedule.from_config(tcfg)
        update = TrainStep(policy, policy_cfg, tcfg, total_updates=schedule.count_updates(tcfg.steps))
        if tcfg.per_alpha > 0 and not policy.reports_priorities:
            raise ConfigError(
                f"training.per_alpha={tcfg.per_alpha} asks for prioritised replay, which needs per-sample "
                f"priorities that {type(policy).__name__} does not report; set training.per_alpha=0"
            )
        buffer = ReplayBuffer(
            tcfg.buffer_capacity, tcfg.n_envs, seed=cfg.seed, alpha=tcfg.per_alpha, beta=tcfg.per_beta
        )
        demos, data = None, None
        if tcfg.offline_ratio > 0:  # batches mix in demonstrations: a resume must read the checkpoint's
            from lerobot.datasets import dataset_fingerprint

            demos = load_demonstrations(cfg, env_cfg, sorted(policy_cfg.input_features))
            data = dataset_fingerprint(cfg.dataset)
            if resume_from is not None:
                check_training_data(resume_from, data, cfg)
        resumed = resume_from is not None
        counts = load_checkpoint_state(resume_from, update, schedule, buffer) if resumed else Counts()
        # Resumed without a saved buffer: no updates until it holds `learning_starts` transitions again.
        refill_needed = tcfg.learning_starts if resumed and len(buffer) == 0 else 0

        collector = Collector(env_cfg, tcfg.n_envs, tcfg.use_async_envs, policy, buffer, schedule, device)
        with (
            contextlib.closing(collector),
            TrainingLoop(
                cfg, run_dir, start=counts.transitions, resumed=resumed, unit="tr", progress=progress
            ) as loop,
            DivergenceGuard(run_dir, update.advice(), keep=tcfg.keep_checkpoints) as guard,
        ):
            if loop.eval_pending:
                loop.evaluate(policy)
            # Seeds derived from the transition count, so a resumed run does not replay the episodes it saw.
            collector.start(cfg.seed + counts.transitions)
            window = LogWindow(wait="collect_s", rate="env_steps_per_s")
            while loop.running:
                t_collect = time.perf_counter()
                counts.transitions = collector.collect(counts.transitions)
                t_update = time.perf_counter()
                n_updates = schedule.updates_after_collection(counts.transitions)
                if len(buffer) < refill_needed or buffer.filled_rows < horizon:
                    n_updates = 0
                for _ in range(n_updates):
                    batch = sample_mixed(buffer, demos, batch_size, horizon, tcfg.offline_ratio)
                    where = f"update {counts.updates + 1} ({counts.transitions} transitions)"
                    output = update(to_device(batch, device), where=where)  # queues the work
                    if buffer.prioritized:  # reads the priorities back: a host sync per update on a GPU
                        buffer.update_priorities(batch[REPLAY_INDEX], output[SAMPLE_PRIORITY])
                    guard.updated()
                    policy.update_target()
                    counts.updates += 1
                window.waited(t_update - t_collect, times=tcfg.train_freq)  # per vector env step
                collected = schedule.transitions_per_collection
                window.counted(steps=collected, updates=n_updates, update_s=time.perf_counter() - t_update)
                counts.train_time_s += time.perf_counter() - t_collect
                due = loop.advance(counts.transitions - loop.step)

                if due.log:
                    loop.log(
                        {
                            **update.metrics.pop(),
                            **collector.episodes.pop(),
                            "lr": update.lr,
                            "updates": counts.updates,
                            "updates_per_transition": window.updates_per_step,
                            **window.pop(),
                            "buffer_size": len(buffer),
                            "train_time_s": counts.train_time_s,
                        }
                    )
                if due.checkpoint or due.eval:
                    update.metrics.check_finite()  # never save or evaluate diverged weights
                kept = buffer if tcfg.save_buffer else None
                if due.checkpoint:
                    save(run_dir, policy, cfg, checkpoint_state(update, schedule, counts, kept), data)
                    guard.saved(counts.transitions)
                if due.eval:
                    loop.evaluate(policy)
                    # The evaluation envs went through the policy: back to a clean state for the train envs.
                    collector.reset_policy(cfg.seed + counts.transitions)
                    if loop.eval_abandoned and not due.checkpoint:  # so that the resumed run redoes it
                        save(run_dir, policy, cfg, checkpoint_state(update, schedule, counts, kept), data)
                        guard.saved(counts.transitions)
    return run_dir
