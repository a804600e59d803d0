"""Offline training: dataset batches -> `TrainStep`, with EMA, checkpoints and evaluation (`TrainingLoop`).

`training.steps` counts gradient steps. Resume is exact on CPU: the checkpoint holds raw weights, optimizer,
LR scheduler, EMA, RNG states and the step, and the data iterator restarts at that step with the same
order, so the loss trajectory after a resume equals the uninterrupted run's.

On N processes (`torchrun`, see `distributed`) the same loop trains one model: `training.batch_size` is
the global batch, each process loads and computes its slice, and the losses, weights and checkpoints are
those of the one-process run (to float rounding), so a run saved on N processes resumes on any M.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from lerobot import distributed, random_state
from lerobot.config import EnvConfig, PolicyConfig, env_config
from lerobot.datasets import EpisodeDataset, cycle_batches, dataset_fingerprint, import_dataset, make_dataset
from lerobot.envs.factory import env_task_names
from lerobot.errors import ConfigError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policies.policy import Policy
from lerobot.policy_registry import make_policy
from lerobot.training.guard import DivergenceGuard
from lerobot.training.pace import LOWER_STEPS, CpuPace, LogWindow
from lerobot.training.progress import TrainingLoop
from lerobot.training.run_dir import RunDir, open_run_dir
from lerobot.training.update import TrainStep, nothing_to_train, restore, to_device

log = logging.getLogger(__name__)


def make_offline_policy(policy_cfg: PolicyConfig, dataset: EpisodeDataset, device: torch.device) -> Policy:
    """The configured policy on `device`, normalizing with `dataset`'s statistics; a config error when it
    learns online only."""
    policy = make_policy(policy_cfg, dataset_stats=dataset.stats).to(device)
    if isinstance(policy, OnlinePolicy):
        raise ConfigError(
            f"policy {policy_cfg.name!r} learns online from its own experience; it cannot train on a dataset "
            "(its config's training_mode must be 'online')"
        )
    if device.type == "cuda":
        policy = policy.to(memory_format=torch.channels_last)
    log.info(
        "policy %s: %.1fM parameters; %d frames in %d episodes",
        policy_cfg.name,
        sum(p.numel() for p in policy.parameters()) / 1e6,
        dataset.num_frames,
        dataset.num_episodes,
    )
    return policy


def save(
    run_dir: RunDir, step: int, policy: Policy, update: TrainStep, data: dict[str, Any] | None = None
) -> None:
    """Checkpoint `step`: the EMA weights (when used) as the model, everything `restore` needs besides, and
    the fingerprint of the training data (`data`, from `dataset_fingerprint`) when given."""
    training_state = {**update.state_dict(), "rng": random_state.get_rng_state(), "step": step}
    with update.averaged_weights():
        model = {k: v.clone() for k, v in policy.state_dict().items()}
    run_dir.save(step, policy, training_state=training_state, eval_state_dict=model, data_fingerprint=data)


def training_data(
    cfg: DictConfig, policy_cfg: PolicyConfig, env_cfg: EnvConfig
) -> tuple[EpisodeDataset, dict[str, Any]]:
    """The run's training split and its fingerprint (`dataset_fingerprint`), which its checkpoints record; a
    resumed run must read the checkpoint's data, unless `training.allow_other_data` (`RunDir.resume`)."""
    # A multi-task env trains on the episodes of its tasks (`env.task`), which the saved config names.
    dataset = make_dataset(
        cfg.dataset,
        env_cfg,
        policy_cfg.delta_timestamps(env_cfg.fps),
        split="train",
        tasks=env_task_names(env_cfg),
    )
    data = dataset_fingerprint(cfg.dataset, dataset.root)
    return dataset, data


def resume(resume_from: Path | None, update: TrainStep) -> tuple[int, Any]:
    """The step the run starts from and the random states it then sets: (0, None) for a new run, else the
    checkpoint's in `resume_from`, loaded into `update` (`restore`)."""
    if resume_from is None:
        return 0, None
    state = restore(resume_from, update)
    log.info("resumed from %s at step %d", resume_from, state["step"])
    return state["step"], state["rng"]


def batch_stream(
    cfg: DictConfig, dataset: EpisodeDataset, batch_size: int, step: int, device: torch.device
) -> Iterator[dict[str, Any]]:
    """This process's batches of `dataset` from `step` on, in the order the uninterrupted run took them
    (`cycle_batches`)."""
    return cycle_batches(
        dataset,
        batch_size=batch_size,
        seed=cfg.seed,
        start_step=step,
        num_workers=cfg.training.num_workers,
        pin_memory=device.type == "cuda",
        shard=(distributed.rank(), distributed.world_size()),
    )


def train_offline(
    cfg: DictConfig, policy_cfg: PolicyConfig, progress: bool = True, slow_run_advice: str = LOWER_STEPS
) -> Path:
    """Train the policy of `policy_cfg` on the demonstrations per the run config `cfg`; return the run
    directory. `slow_run_advice`: what would be faster, said when the run would take hours on a CPU
    (`CpuPace`)."""
    env_cfg = env_config(cfg)
    batch_size = cfg.training.batch_size or policy_cfg.batch_size  # the global batch
    distributed.shard_size(batch_size)  # fails before any process waits for another
    device = distributed.init(distributed.resolve_device(cfg.device))
    # The main process names, locks and creates the run directory (and converts the data once); the others
    # use it. It stays locked until training ends.
    with open_run_dir(cfg) as run_dir:
        cfg.output_dir = str(run_dir.path)
        distributed.on_main(lambda: import_dataset(cfg.dataset))
        # Every process draws the same random numbers: each takes its slice of the global batch's draws.
        random_state.set_seed(cfg.seed)
        dataset, data = training_data(cfg, policy_cfg, env_cfg)
        resume_from = run_dir.resume(data)  # the checkpoint to restore, trained on this data
        policy = make_offline_policy(policy_cfg, dataset, device)
        update = TrainStep(policy, policy_cfg, cfg.training, total_updates=cfg.training.steps)
        step, rng = resume(resume_from, update)  # the random states are set once the loader exists
        if resume_from is not None and nothing_to_train(step, cfg.training.steps):
            return run_dir.path
        # Creating the loader iterator draws from the global RNG (its base seed), so it is created before the
        # saved RNG state is restored: after that, a resumed run consumes random numbers exactly as the
        # uninterrupted one did.
        batches = batch_stream(cfg, dataset, batch_size, step, device)
        if rng is not None:
            random_state.set_rng_state(rng)

        window = LogWindow(wait="data_s", rate="samples_per_s", samples_per_step=batch_size)
        pace = CpuPace(device, cfg.training.steps - step, advice=slow_run_advice)
        with (
            TrainingLoop(
                cfg, run_dir.path, start=step, resumed=resume_from is not None, unit="step", progress=progress
            ) as loop,
            DivergenceGuard(run_dir.path, update.advice(), keep=cfg.training.keep_checkpoints) as guard,
        ):
            if loop.eval_pending:
                with update.averaged_weights():
                    loop.evaluate(policy)
            while loop.running:
                t0 = time.perf_counter()
                batch = to_device(next(batches), device)
                window.waited(time.perf_counter() - t0)
                update(batch, where=f"step {loop.step + 1}")  # queues the work; reads nothing back
                window.counted(steps=1, updates=1)  # the update's time is the window's rest (`LogWindow`)
                guard.updated()
                pace.step()
                due = loop.advance(1)

                if due.log:
                    loop.log({**update.metrics.pop(), "lr": update.lr, **window.pop()})
                t0 = time.perf_counter()
                if due.checkpoint or due.eval:
                    update.metrics.check_finite()  # never save or evaluate diverged weights
                if due.checkpoint and distributed.is_main():
                    save(run_dir, loop.step, policy, update, data)
                    guard.saved(loop.step)
                if due.eval:
                    with update.averaged_weights():
                        loop.evaluate(policy)
                    if loop.eval_abandoned and not due.checkpoint:  # so that the resumed run redoes it
                        save(run_dir, loop.step, policy, update, data)
                        guard.saved(loop.step)
                window.exclude(time.perf_counter() - t0)
        # Ends the loader's workers now: they ignore SIGTERM (see `make_dataloader`), so the exit-time
        # terminate-and-join of multiprocessing must find none left.
        del batches
        distributed.barrier()  # the main process has written everything before any process leaves
    return run_dir.path
