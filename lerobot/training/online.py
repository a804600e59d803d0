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

Stops and faults: a stop signal is honoured at the next vector step or update, not only after a whole
collection and its updates (TD-MPC's first burst is 5,000 updates, minutes on a CPU): the checkpoint then
records the vector steps taken of the collection under way and the updates still owed for the last one
(`Counts`), which the resumed run takes and makes first. With async envs (`training.use_async_envs`) every
step waits at most `eval.step_timeout_s` on the workers, a stop signal abandons the wait, and a worker that
dies or does not answer ends the run with one line naming it, after a checkpoint of the last step completed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from omegaconf import DictConfig

from lerobot import distributed
from lerobot.checkpoints.run import latest_checkpoint, save_checkpoint
from lerobot.config import EnvConfig, PolicyConfig, env_config
from lerobot.constants import ACTION, EPISODE_INDEX, NEXT_REWARD, REPLAY_INDEX, SAMPLE_PRIORITY
from lerobot.envs import close_now, make_env, observation_to_batch
from lerobot.envs.faults import Watchdog
from lerobot.errors import ConfigError, EnvWorkerError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policy_registry import make_policy
from lerobot.rollout import ASYNC_RESET_TIMEOUT_S, act, reset_envs, step_envs
from lerobot.runtime import signals
from lerobot.runtime.signals import WaitInterrupted
from lerobot.training.guard import DivergenceGuard
from lerobot.training.progress import TrainingLoop
from lerobot.training.replay_buffer import ReplayBuffer, sample_mixed
from lerobot.training.run_dir import check_training_data, run_directory
from lerobot.training.update import (
    LOWER_STEPS,
    CpuPace,
    LogWindow,
    TrainStep,
    nothing_to_train,
    restore,
    to_device,
)

log = logging.getLogger(__name__)

# Collections timed (after one more, which warms up) for a CPU run's estimate of its time (`CpuPace`): a
# TD-MPC recipe's take 0.1 s each on a CPU, and updates alternate between collections when utd_ratio < 1.
PACE_COLLECTIONS = 10


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
    # Vector steps taken of the collection under way (0 between collections): a stop or a failed env worker
    # may end one halfway, and the resumed run takes the rest before that collection's updates.
    collection_steps: int = 0
    # Updates due after the last collection and not made yet (a stop in the middle of them); the resumed
    # run makes them before it collects again.
    updates_owed: int = 0


class Collector:
    """The train envs and their current observations: steps them and stores the transitions in `buffer`.

    The envs autoreset in the same step (`AutoresetMode.SAME_STEP`), so every vector step is a real transition
    for every env. Actions are uniform random while `schedule.random_actions` says so, the policy's (with
    `explore` on, through the acting step `lerobot.rollout.act`) afterwards; a NaN or infinite one stops
    the run before it reaches an env (it would poison the env's state and the replay buffer). `episodes`
    gathers the returns and lengths of the episodes the envs finish.

    Async envs wait at most `step_timeout_s` for a step (a watchdog enforces it; None: no limit, resets then
    wait `ASYNC_RESET_TIMEOUT_S`): a worker that dies or does not answer raises `EnvWorkerError` naming it,
    and a stop signal abandons the wait (`WaitInterrupted`). Either way the workers are killed at once, and
    the envs are not used again.
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
        step_timeout_s: float | None = None,
    ):
        self.envs = make_env(
            env_cfg, n_envs, use_async=use_async, autoreset_mode=AutoresetMode.SAME_STEP, render_mode=None
        )
        self.n_envs = n_envs
        self.policy = policy
        self.buffer = buffer
        self.schedule = schedule
        self.device = device
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = ASYNC_RESET_TIMEOUT_S if step_timeout_s is None else step_timeout_s
        self.watchdog = Watchdog(self.envs) if isinstance(self.envs, AsyncVectorEnv) else None
        self.obs: dict[str, np.ndarray] = {}
        self.episodes = _EpisodeStats(n_envs)

    def _wait(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(self.envs, *args)` (`step_envs`, `reset_envs`). On async envs a stop signal abandons the wait
        (`WaitInterrupted`): a stopped or hung worker would keep the run from stopping. A sync env's call
        runs env code in this process, which a signal must not cut (`lerobot.envs.faults.ENV_CALLS`), and
        ends within the step's time."""
        if self.watchdog is None:
            return call(self.envs, *args)
        stop = signals.active()
        try:
            with stop.waiting() if stop is not None else contextlib.nullcontext():
                return call(self.envs, *args)
        except (WaitInterrupted, EnvWorkerError):
            close_now(self.envs)  # workers halfway through a call, or dead, or stopped: never waited on
            raise

    def start(self, seed: int) -> None:
        """Start fresh episodes in every env: env `i` is reset with `seed + i`; actions and noise are reseeded."""
        self.envs.action_space.seed(seed)
        seeds = [seed + i for i in range(self.n_envs)]
        self.obs, _ = self._wait(reset_envs, seeds, None, self.reset_timeout_s, self.watchdog)
        self.buffer.start_episodes()  # a resumed buffer's last episodes end where they were cut
        self.reset_policy(seed)

    def reset_policy(self, seed: int) -> None:
        """Clear the policy's per-env state (history, warm-started plans) and reseed its exploration noise."""
        self.policy.reset()
        self.policy.set_noise_seed(seed)

    def collect(self, counts: Counts, stop_requested: Callable[[], bool]) -> None:
        """Take the vector steps left of the collection under way (`train_freq` less
        `counts.collection_steps`), each counted in `counts` once its transitions are stored, until
        `stop_requested()` says otherwise at a step boundary."""

        def describe_slot(slot: int) -> str:  # read when an action is refused: the count at that step
            return f"train env slot {slot} after {counts.transitions} transitions"

        self.policy.eval()
        self.policy.explore = True
        try:
            while counts.collection_steps < self.schedule.train_freq and not stop_requested():
                self.policy.set_progress(counts.transitions)
                if self.schedule.random_actions(counts.transitions):
                    action = self.envs.action_space.sample()
                else:
                    action = act(self.policy, self.obs, self.device, describe_slot, self.NON_FINITE_ADVICE)
                next_obs, reward, terminated, truncated, info = self._wait(
                    step_envs, action, self.step_timeout_s, self.watchdog
                )
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
                counts.transitions += self.n_envs
                counts.collection_steps += 1
        finally:
            self.policy.explore = False  # evaluation and checkpoints never see exploration on

    def close(self) -> None:
        """Close the train envs (at once where a call to their workers was cut short, `close_now`)."""
        if self.watchdog is not None:
            self.watchdog.close()
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
        "collection_steps": counts.collection_steps,
        "updates_owed": counts.updates_owed,
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

    The replay buffer is restored when the checkpoint holds one, else `buffer` stays empty; one saved with
    another `training.n_envs` or `buffer_capacity` (a branch, `training.init_from`) is copied into this
    run's layout (`ReplayBuffer.load_state_dict`).
    """
    state = restore(ckpt_dir, update)
    schedule.load_state_dict(state["schedule"])
    counts = Counts(
        state["transitions"],
        state["updates"],
        float(state.get("train_time_s", 0.0)),
        # Checkpoints written before a stop could cut a collection or its updates short hold neither.
        int(state.get("collection_steps", 0)),
        int(state.get("updates_owed", 0)),
    )
    distributed.set_rng_state(state["rng"])
    if "replay_buffer" in state:
        saved = state["replay_buffer"]
        buffer.load_state_dict(saved)
        if (saved["rows"], saved["n_envs"]) != (buffer.rows, buffer.n_envs):
            log.info(
                "the replay buffer's %d transitions of %d envs copied into %d rows x %d envs: %d kept (the "
                "newest of each env)",
                int(saved["data"]["valid"].sum()) if saved["data"] else 0,
                saved["n_envs"],
                buffer.rows,
                buffer.n_envs,
                len(buffer),
            )
    owed = f", {counts.updates_owed} updates owed" if counts.updates_owed else ""
    log.info(
        "resumed from %s at %d transitions (%d updates%s)", ckpt_dir, counts.transitions, counts.updates, owed
    )
    return counts


def train_online(
    cfg: DictConfig, policy_cfg: PolicyConfig, progress: bool = True, slow_run_advice: str = LOWER_STEPS
) -> Path:
    """Train an `OnlinePolicy` (TD-MPC) as configured; return the run directory.

    `cfg` is the validated root config, `policy_cfg` its policy section built (`make_policy_config`).
    With `training.resume=true` and `output_dir` pointing at an earlier
    run, continues from its last checkpoint: weights, optimiser, schedule, counters and random states, and the
    replay buffer when it was saved (`training.save_buffer`). Without a saved buffer, updates wait until
    `learning_starts` new transitions (collected by the restored policy) are in the buffer (the updates a
    stop left owed are made then). Env states are not saved: a resumed run starts fresh episodes.
    `slow_run_advice`: what would be faster, said when the run would take hours on a CPU (`CpuPace`).
    """
    # Locked until training ends (`run_directory`).
    with run_directory(cfg) as (run_dir, resume_from):
        tcfg = cfg.training
        env_cfg = env_config(cfg)
        # As offline: the policy's config stays as validation built it.
        batch_size = tcfg.batch_size or policy_cfg.batch_size
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
        if nothing_to_train(counts.transitions, tcfg.steps):
            return run_dir
        # Resumed without a saved buffer: no updates until it holds `learning_starts` transitions again.
        refill_needed = tcfg.learning_starts if resumed and len(buffer) == 0 else 0

        collector = Collector(
            env_cfg,
            tcfg.n_envs,
            tcfg.use_async_envs,
            policy,
            buffer,
            schedule,
            device,
            cfg.eval.step_timeout_s,
        )
        with (
            contextlib.closing(collector),
            TrainingLoop(
                cfg, run_dir, start=counts.transitions, resumed=resumed, unit="tr", progress=progress
            ) as loop,
            DivergenceGuard(run_dir, update.advice(), keep=tcfg.keep_checkpoints) as guard,
        ):
            saved = (counts.transitions, counts.updates)  # what the last checkpoint holds (fresh: nothing)

            def checkpoint() -> None:
                nonlocal saved
                update.metrics.check_finite()  # never save diverged weights
                kept = buffer if tcfg.save_buffer else None
                save(run_dir, policy, cfg, checkpoint_state(update, schedule, counts, kept), data)
                guard.saved(counts.transitions)
                saved = (counts.transitions, counts.updates)

            if loop.eval_pending:
                loop.evaluate(policy)
            window = LogWindow(wait="collect_s", rate="env_steps_per_s")

            def can_sample() -> bool:  # else no updates are due for a collection (counting is not free)
                return len(buffer) >= refill_needed and buffer.filled_rows >= horizon

            ready = can_sample()
            # Timed once the loop runs as it will to the end: the policy acts and the first burst is made.
            pace: CpuPace | None = None
            started = False
            while loop.running:
                t_collect = time.perf_counter()
                before = counts.transitions
                collected_all = False
                try:
                    if not started:
                        # Seeds from the transition count, so a resumed run does not replay the episodes it saw.
                        collector.start(cfg.seed + counts.transitions)
                        started = True
                    # Owed updates come first, once there is something to sample them from.
                    if counts.updates_owed == 0 or not ready:
                        collector.collect(counts, lambda: loop.stop_requested)
                        ready = can_sample()
                        if counts.collection_steps >= tcfg.train_freq:
                            collected_all, counts.collection_steps = True, 0
                            due_now = schedule.updates_after_collection(counts.transitions)
                            counts.updates_owed += due_now if ready else 0
                except WaitInterrupted:
                    pass  # the stop signal that cut the wait ends the loop at the last step completed
                except EnvWorkerError as e:
                    if (counts.transitions, counts.updates) != saved:
                        checkpoint()
                    raise EnvWorkerError(f"{e}; {_where_it_stopped(run_dir, counts)}") from None
                t_update = time.perf_counter()
                n_updates = 0
                # One update at a time, so that a stop signal is honoured between two of a long burst.
                while counts.updates_owed > 0 and ready and not loop.stop_requested:
                    batch = sample_mixed(buffer, demos, batch_size, horizon, tcfg.offline_ratio)
                    where = f"update {counts.updates + 1} ({counts.transitions} transitions)"
                    output = update(to_device(batch, device), where=where)  # queues the work
                    if buffer.prioritized:  # reads the priorities back: a host sync per update on a GPU
                        buffer.update_priorities(batch[REPLAY_INDEX], output[SAMPLE_PRIORITY])
                    guard.updated()
                    policy.update_target()
                    counts.updates += 1
                    counts.updates_owed -= 1
                    n_updates += 1
                collected = counts.transitions - before
                window.waited(t_update - t_collect, times=collected // tcfg.n_envs)  # per vector env step
                window.counted(steps=collected, updates=n_updates, update_s=time.perf_counter() - t_update)
                counts.train_time_s += time.perf_counter() - t_collect
                if collected_all and before > tcfg.learning_starts and ready:
                    if pace is None:
                        pace = CpuPace(
                            device,
                            tcfg.steps - before,
                            warm_up=1,
                            measured=PACE_COLLECTIONS,
                            advice=slow_run_advice,
                        )
                    pace.step(collected)
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
                if due.checkpoint:
                    checkpoint()
                if due.eval:
                    update.metrics.check_finite()  # never evaluate diverged weights
                    loop.evaluate(policy)
                    # The evaluation envs went through the policy: back to a clean state for the train envs.
                    collector.reset_policy(cfg.seed + counts.transitions)
                    if loop.eval_abandoned and not due.checkpoint:  # so that the resumed run redoes it
                        checkpoint()
    return run_dir


def _where_it_stopped(run_dir: Path, counts: Counts) -> str:
    """What an env worker's failure leaves of the run, for its one line: the checkpoint of the last step
    completed, and how to resume from it."""
    last = latest_checkpoint(run_dir)
    if last is None:
        return "no checkpoint was saved: run the command again to start over"
    return (
        f"checkpoint {last.name} holds the run at {counts.transitions} transitions, the last step completed: "
        f"relaunch with output_dir={run_dir} to resume"
    )
