"""Online off-policy training of an `OnlinePolicy` (TD-MPC) from `n_envs` vector envs, SB3 schedule semantics.

The loop, top to bottom:

    repeat until `training.steps` transitions have been collected:
        collect: `train_freq` vector steps (`Collector`); each adds `n_envs` transitions to the replay buffer.
                 Actions are uniform random over the action bounds while fewer than `learning_starts`
                 transitions have been collected, the policy's (with `explore` on) afterwards.
        update:  `UpdateSchedule.updates_after_collection` gradient steps (`TrainStep`) on sub-trajectories of
                 `policy.replay_horizon` transitions from the buffer, each followed by `policy.update_target()`.
        every `log_freq` / `save_freq` / `eval.freq` transitions: log, checkpoint, evaluate (`TrainingLoop`).

Counting follows SB3: `training.steps` counts env transitions over all envs (n_envs per vector step), the x
axis of every log; what `train_freq`, `gradient_steps`, `utd_ratio`, `learning_starts` and `initial_updates`
count is said in `schedule.py`. `training.per_alpha` / `per_beta`: prioritised replay (0: uniform); after
each update the policy's per-sample priorities are written back to the buffer. A run that mixes in
demonstrations (`training.offline_ratio`) reads them as `demonstrations.py` says; what a checkpoint holds is
in `online_state.py`.

Stops and faults: a stop signal is honoured at the next vector step or update, not only after a whole
collection and its updates (TD-MPC's first burst is 5,000 updates, minutes on a CPU): the checkpoint then
records the vector steps taken of the collection under way and the updates still owed for the last one
(`Counts`), which the resumed run takes and makes first. With async envs (`training.use_async_envs`) every
step waits at most `eval.step_timeout_s` on the workers, a stop signal abandons the wait, and a worker that
dies or does not answer ends the run with one line naming it, after a checkpoint of the last step completed.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from lerobot import distributed, random_state
from lerobot.config import EnvConfig, PolicyConfig, env_config
from lerobot.constants import REPLAY_INDEX, SAMPLE_PRIORITY
from lerobot.errors import ConfigError, EnvWorkerError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policy_registry import make_policy
from lerobot.runtime.signals import WaitInterrupted
from lerobot.training.collector import Collector
from lerobot.training.demonstrations import run_demonstrations, sample_mixed
from lerobot.training.guard import DivergenceGuard
from lerobot.training.online_state import (
    Counts,
    checkpoint_state,
    load_checkpoint_state,
    save,
    where_it_stopped,
)
from lerobot.training.pace import LOWER_STEPS, CpuPace, LogWindow
from lerobot.training.progress import TrainingLoop
from lerobot.training.replay_buffer import ReplayBuffer
from lerobot.training.run_dir import RunDir, open_run_dir
from lerobot.training.schedule import UpdateSchedule
from lerobot.training.update import TrainStep, nothing_to_train, to_device

# Collections timed (after one more, which warms up) for a CPU run's estimate of its time (`CpuPace`): a
# TD-MPC recipe's take 0.1 s each on a CPU, and updates alternate between collections when utd_ratio < 1.
PACE_COLLECTIONS = 10


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


@dataclass
class OnlineRun:
    """What an online run trains with (`set_up`): the policy and its update, the schedule, the replay buffer,
    the demonstrations mixed into its batches with their fingerprint (`data`), and its counts."""

    policy: OnlinePolicy
    update: TrainStep
    schedule: UpdateSchedule
    buffer: ReplayBuffer
    demos: ReplayBuffer | None
    data: dict[str, Any] | None
    counts: Counts
    resumed: bool  # started from a checkpoint: its own run's, or another's (a branch, `training.init_from`)
    batch_size: int
    horizon: int  # transitions per replayed sub-trajectory (`policy.replay_horizon`)
    # Resumed without a saved buffer: no updates until it holds `learning_starts` transitions again.
    refill_needed: int
    saved: tuple[int, int]  # (transitions, updates) the last checkpoint holds (fresh: nothing)

    def can_sample(self) -> bool:
        """Whether the buffer can give batches; else no updates are due for a collection (counting is not
        free)."""
        return len(self.buffer) >= self.refill_needed and self.buffer.filled_rows >= self.horizon


def set_up(
    cfg: DictConfig,
    policy_cfg: PolicyConfig,
    env_cfg: EnvConfig,
    device: torch.device,
    run_dir: RunDir,
) -> OnlineRun:
    """Seed the run and build what it trains with, restored from the checkpoint `run_dir` continues from
    when it resumes (`RunDir.resume`, `load_checkpoint_state`)."""
    tcfg = cfg.training
    random_state.set_seed(cfg.seed)
    policy = make_online_policy(policy_cfg, device)
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
    demos, data = run_demonstrations(cfg, env_cfg, policy_cfg)
    resume_from = run_dir.resume(data)  # the checkpoint to restore, trained on these demonstrations
    resumed = resume_from is not None
    counts = load_checkpoint_state(resume_from, update, schedule, buffer) if resumed else Counts()
    refill_needed = tcfg.learning_starts if resumed and len(buffer) == 0 else 0
    # As offline: the policy's config stays as validation built it.
    batch_size = tcfg.batch_size or policy_cfg.batch_size
    saved = (counts.transitions, counts.updates)
    return OnlineRun(
        policy,
        update,
        schedule,
        buffer,
        demos,
        data,
        counts,
        resumed,
        batch_size,
        policy.replay_horizon,
        refill_needed,
        saved,
    )


def make_collector(cfg: DictConfig, env_cfg: EnvConfig, run: OnlineRun, device: torch.device) -> Collector:
    """The run's train envs (`training.n_envs`, async when `training.use_async_envs`, each step waiting at most
    `eval.step_timeout_s`), acting with its policy and storing into its buffer. Raises `ConfigError` (the envs
    closed) where the policy cannot learn this run (`OnlinePolicy.check_run`: its action space, its schedule)."""
    tcfg = cfg.training
    collector = Collector(
        env_cfg,
        tcfg.n_envs,
        tcfg.use_async_envs,
        run.policy,
        run.buffer,
        run.schedule,
        device,
        cfg.eval.step_timeout_s,
    )
    try:
        run.policy.check_run(tcfg, collector.envs.single_action_space)
    except ConfigError:
        collector.close()  # its env workers too
        raise
    return collector


def complete_collection(run: OnlineRun, ready: bool) -> bool:
    """Whether the collection under way has taken its `train_freq` vector steps; if so, the next one starts
    and the updates due after it are owed (none while the buffer cannot give batches: `ready`)."""
    counts = run.counts
    if counts.collection_steps < run.schedule.train_freq:
        return False
    counts.collection_steps = 0
    due_now = run.schedule.updates_after_collection(counts.transitions)  # its carry counts either way
    counts.updates_owed += due_now if ready else 0
    return True


def make_owed_updates(
    run: OnlineRun, offline_ratio: float, device: torch.device, guard: DivergenceGuard, loop: TrainingLoop
) -> int:
    """Make the updates `run.counts` owes, one at a time so that a stop signal is honoured between two of a
    long burst: a batch of replay (and demonstrations), the update, the priorities written back, the target
    step. Return how many were made."""
    counts, buffer = run.counts, run.buffer
    n_updates = 0
    while counts.updates_owed > 0 and not loop.stop_requested:
        batch = sample_mixed(buffer, run.demos, run.batch_size, run.horizon, offline_ratio)
        where = f"update {counts.updates + 1} ({counts.transitions} transitions)"
        output = run.update(to_device(batch, device), where=where)  # queues the work
        if buffer.prioritized:  # reads the priorities back: a host sync per update on a GPU
            buffer.update_priorities(batch[REPLAY_INDEX], output[SAMPLE_PRIORITY])
        guard.updated()
        run.policy.update_target()
        counts.updates += 1
        counts.updates_owed -= 1
        n_updates += 1
    return n_updates


def checkpoint(run: OnlineRun, run_dir: RunDir, cfg: DictConfig, guard: DivergenceGuard) -> None:
    """Checkpoint the run at its transition count, with its replay buffer when `training.save_buffer`; never
    diverged weights (the update's metrics are checked first)."""
    counts = run.counts
    run.update.metrics.check_finite()
    kept = run.buffer if cfg.training.save_buffer else None
    save(run_dir, run.policy, checkpoint_state(run.update, run.schedule, counts, kept), run.data)
    guard.saved(counts.transitions)
    run.saved = (counts.transitions, counts.updates)


def log_record(run: OnlineRun, collector: Collector, window: LogWindow) -> dict[str, float]:
    """The metrics of a log: the updates', the finished episodes', the counts and the window's timing."""
    return {
        **run.update.metrics.pop(),
        **collector.episodes.pop(),
        "lr": run.update.lr,
        "updates": run.counts.updates,
        "updates_per_transition": window.updates_per_step,
        **window.pop(),
        "buffer_size": len(run.buffer),
        "train_time_s": run.counts.train_time_s,
    }


def train_online(
    cfg: DictConfig, policy_cfg: PolicyConfig, progress: bool = True, slow_run_advice: str = LOWER_STEPS
) -> Path:
    """Train an `OnlinePolicy` (TD-MPC, SAC) as configured; return the run directory.

    `cfg` is the validated root config, `policy_cfg` its policy section built (`make_policy_config`).
    With `training.resume=true` and `output_dir` pointing at an earlier
    run, continues from its last checkpoint: weights, optimiser, schedule, counters and random states, and the
    replay buffer when it was saved (`training.save_buffer`). Without a saved buffer, updates wait until
    `learning_starts` new transitions (collected by the restored policy) are in the buffer (the updates a
    stop left owed are made then). Env states are not saved: a resumed run starts fresh episodes.
    `slow_run_advice`: what would be faster, said when the run would take hours on a CPU (`CpuPace`).
    """
    with open_run_dir(cfg) as run_dir:  # locked until training ends; resume or branch decided
        tcfg, env_cfg = cfg.training, env_config(cfg)
        device = distributed.resolve_device(cfg.device)
        run = set_up(cfg, policy_cfg, env_cfg, device, run_dir)
        counts = run.counts
        if nothing_to_train(counts.transitions, tcfg.steps):
            return run_dir.path
        collector = make_collector(cfg, env_cfg, run, device)  # one line for a run this learner cannot train
        with (
            contextlib.closing(collector),
            TrainingLoop(
                cfg, run_dir.path, start=counts.transitions, resumed=run.resumed, unit="tr", progress=progress
            ) as loop,
            DivergenceGuard(run_dir.path, run.update.advice(), keep=tcfg.keep_checkpoints) as guard,
        ):
            if loop.eval_pending:
                loop.evaluate(run.policy)
            window = LogWindow(wait="collect_s", rate="env_steps_per_s")
            ready = run.can_sample()
            # Timed once the loop runs as it will to the end: the policy acts and the first burst is made.
            pace: CpuPace | None = None
            started = False
            while loop.running:
                t_collect, before, collected_all = time.perf_counter(), counts.transitions, False
                try:
                    if not started:
                        # Seeds from the transition count, so a resumed run does not replay the episodes it saw.
                        collector.start(cfg.seed + counts.transitions)
                        started = True
                    # Owed updates come first, once there is something to sample them from.
                    if counts.updates_owed == 0 or not ready:
                        collector.collect(counts, lambda: loop.stop_requested)
                        ready = run.can_sample()
                        collected_all = complete_collection(run, ready)
                except WaitInterrupted:
                    pass  # the stop signal that cut the wait ends the loop at the last step completed
                except EnvWorkerError as e:
                    if (counts.transitions, counts.updates) != run.saved:
                        checkpoint(run, run_dir, cfg, guard)
                    raise EnvWorkerError(f"{e}; {where_it_stopped(run_dir.path, counts)}") from None
                t_update = time.perf_counter()
                n_updates = make_owed_updates(run, tcfg.offline_ratio, device, guard, loop) if ready else 0
                collected = counts.transitions - before
                window.waited(t_update - t_collect, times=collected // tcfg.n_envs)  # per vector env step
                window.counted(steps=collected, updates=n_updates, update_s=time.perf_counter() - t_update)
                counts.train_time_s += time.perf_counter() - t_collect
                if collected_all and before > tcfg.learning_starts and ready:
                    left = tcfg.steps - before
                    pace = pace or CpuPace(device, left, measured=PACE_COLLECTIONS, advice=slow_run_advice)
                    pace.step(collected)
                due = loop.advance(counts.transitions - loop.step)

                if due.log:
                    loop.log(log_record(run, collector, window))
                if due.checkpoint:
                    checkpoint(run, run_dir, cfg, guard)
                if due.eval:
                    run.update.metrics.check_finite()  # never evaluate diverged weights
                    loop.evaluate(run.policy)
                    # The evaluation envs went through the policy: back to a clean state for the train envs.
                    collector.reset_policy(cfg.seed + counts.transitions)
                    if loop.eval_abandoned and not due.checkpoint:  # so that the resumed run redoes it
                        checkpoint(run, run_dir, cfg, guard)
    return run_dir.path
