"""Offline training: dataset batches -> `TrainStep`, with EMA, checkpoints and evaluation (`TrainingLoop`).

`training.steps` counts gradient steps. Resume is exact on CPU: the checkpoint holds raw weights, optimizer,
LR scheduler, EMA, RNG states and the step, and the data iterator restarts at that step with the same
order, so the loss trajectory after a resume equals the uninterrupted run's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from lerobot.config import ConfigError, env_config
from lerobot.datasets import cycle_batches, make_dataset
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.training.checkpoint import get_rng_state, load_training_state, save_checkpoint, set_rng_state
from lerobot.training.common import resolve_device, set_seed, setup_run
from lerobot.training.loop import TrainingLoop, TrainStep

log = logging.getLogger(__name__)


def train_offline(cfg: DictConfig, progress: bool = True) -> Path:
    """Train a policy on the demonstrations per `cfg`; return the run directory."""
    run_dir, resume_from = setup_run(cfg)
    device = resolve_device(cfg.device)
    set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    batch_size = cfg.training.batch_size or policy_cfg.batch_size
    dataset = make_dataset(cfg.dataset, env_cfg, policy_cfg.delta_timestamps(env_cfg.fps), split="train")
    policy = make_policy(policy_cfg, dataset_stats=dataset.stats).to(device)
    if isinstance(policy, OnlinePolicy):
        raise ConfigError(
            f"policy {policy_cfg.name!r} learns online from its own experience; it cannot train on a dataset "
            "(its config's training_mode must be 'online')"
        )
    if device.type == "cuda":
        policy = policy.to(memory_format=torch.channels_last)
    update = TrainStep(policy, policy_cfg, cfg.training, total_updates=cfg.training.steps)
    log.info(
        "policy %s: %.1fM parameters; %d frames in %d episodes",
        policy_cfg.name,
        sum(p.numel() for p in policy.parameters()) / 1e6,
        dataset.num_frames,
        dataset.num_episodes,
    )

    step = 0
    state = load_training_state(resume_from) if resume_from is not None else None
    if state is not None:
        policy.load_state_dict(state["model"])
        update.optimizer.load_state_dict(state["optimizer"])
        update.scheduler.load_state_dict(state["scheduler"])
        if update.ema is not None:
            update.ema.load_state_dict(state["ema"])
        step = state["step"]
        log.info("resumed from %s at step %d", resume_from, step)
    # Creating the loader iterator draws from the global RNG (its base seed), so it is created before the
    # saved RNG state is restored: after that, a resumed run consumes random numbers exactly as the
    # uninterrupted one did.
    batches = cycle_batches(
        dataset,
        batch_size=batch_size,
        seed=cfg.seed,
        start_step=step,
        num_workers=cfg.training.num_workers,
        pin_memory=device.type == "cuda",
    )
    if state is not None:
        set_rng_state(state["rng"])

    data_s = update_s = 0.0  # since the last log, over `window` steps
    window = 0
    with TrainingLoop(
        cfg, run_dir, start=step, resumed=state is not None, unit="step", progress=progress
    ) as loop:
        while loop.running:
            t0 = time.perf_counter()
            batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
            t1 = time.perf_counter()
            output = update(batch, where=f"step {loop.step + 1}")
            if device.type == "cuda":
                torch.cuda.synchronize()  # so that update_s measures the update, not its launch
            data_s += t1 - t0
            update_s += time.perf_counter() - t1
            window += 1
            due = loop.advance(1)

            if due.log:
                metrics = {k: v.item() for k, v in output.items() if v.numel() == 1}
                metrics.update(
                    lr=update.lr,
                    data_s=data_s / window,
                    update_s=update_s / window,
                    samples_per_s=batch_size * window / max(data_s + update_s, 1e-9),
                )
                loop.log(metrics)
                data_s = update_s = 0.0
                window = 0
            if due.checkpoint:
                training_state = {
                    "model": policy.state_dict(),
                    "optimizer": update.optimizer.state_dict(),
                    "scheduler": update.scheduler.state_dict(),
                    "ema": update.ema.state_dict() if update.ema is not None else None,
                    "rng": get_rng_state(),
                    "step": loop.step,
                }
                with update.averaged_weights():
                    model = {k: v.clone() for k, v in policy.state_dict().items()}
                save_checkpoint(run_dir, loop.step, policy, cfg, training_state, eval_state_dict=model)
            if due.eval:
                with update.averaged_weights():
                    loop.evaluate(policy)
    return run_dir
