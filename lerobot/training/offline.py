"""Offline training: dataset -> batch -> policy.forward -> loss -> optimizer, with EMA, checkpoints, eval.

Resume is exact on CPU: the checkpoint holds raw weights, optimizer, LR scheduler, EMA, RNG states and the
step, and the data iterator restarts at that step with the same order, so the loss trajectory after a
resume equals the uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from lerobot.config import env_config
from lerobot.datasets import cycle_batches, make_dataset
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.training.checkpoint import get_rng_state, load_training_state, save_checkpoint, set_rng_state
from lerobot.training.common import (
    TrainingDivergedError,
    build_optimizer,
    resolve_device,
    run_evaluation,
    set_seed,
    setup_run,
)
from lerobot.training.logger import MetricsLogger

log = logging.getLogger(__name__)


def _to_device(batch: dict, device: torch.device) -> dict:
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
    }


@contextlib.contextmanager
def _ema_weights(policy: torch.nn.Module, ema):
    """Temporarily swap the EMA weights into `policy` (no-op without EMA)."""
    if ema is None:
        yield
        return
    ema.store(policy.parameters())
    ema.copy_to(policy.parameters())
    try:
        yield
    finally:
        ema.restore(policy.parameters())


def train_offline(cfg: DictConfig) -> Path:
    """Train a policy on the demonstrations per `cfg`; return the run directory."""
    run_dir, resume_from = setup_run(cfg)
    device = resolve_device(cfg.device)
    set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    batch_size = cfg.training.batch_size or policy_cfg.batch_size
    dataset = make_dataset(cfg.dataset, env_cfg, policy_cfg.delta_timestamps(env_cfg.fps), split="train")
    policy = make_policy(policy_cfg, dataset_stats=dataset.stats).to(device)
    if device.type == "cuda":
        policy = policy.to(memory_format=torch.channels_last)
    optimizer, scheduler = build_optimizer(policy, policy_cfg, cfg.training.steps)
    ema = None
    if policy_cfg.use_ema:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(
            policy.parameters(),
            decay=policy_cfg.ema_max_decay,
            use_ema_warmup=True,
            power=policy_cfg.ema_power,
        )
    n_params = sum(p.numel() for p in policy.parameters())
    log.info(
        "policy %s: %.1fM parameters; %d frames in %d episodes",
        policy_cfg.name,
        n_params / 1e6,
        dataset.num_frames,
        dataset.num_episodes,
    )

    step = 0
    state = load_training_state(resume_from) if resume_from is not None else None
    if state is not None:
        policy.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
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
    logger = MetricsLogger(run_dir, cfg, resume_step=step if resume_from is not None else None)

    def checkpoint() -> None:
        training_state = {
            "model": policy.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
            "rng": get_rng_state(),
            "step": step,
        }
        with _ema_weights(policy, ema):
            eval_weights = {k: v.clone() for k, v in policy.state_dict().items()}
        save_checkpoint(run_dir, step, policy, cfg, training_state, eval_state_dict=eval_weights)

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.training.use_amp)
    bar = tqdm(total=cfg.training.steps, initial=step, desc="train", dynamic_ncols=True)
    data_s = update_s = 0.0
    window = 0
    try:
        while step < cfg.training.steps:
            t0 = time.perf_counter()
            batch = _to_device(next(batches), device)
            t1 = time.perf_counter()
            policy.train()
            with autocast:
                output = policy.forward(batch)
            loss = output["loss"]
            if not torch.isfinite(loss):
                raise TrainingDivergedError(
                    f"loss is {loss.item()} at step {step + 1}; stopping. The last good checkpoint is "
                    f"{run_dir / 'checkpoints' / 'last'} (if one was saved); lower the learning rate or enable grad clipping"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.training.grad_clip_norm)
            optimizer.step()
            scheduler.step()
            if ema is not None:
                ema.step(policy.parameters())
            if device.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            step += 1
            data_s += t1 - t0
            update_s += t2 - t1
            window += 1
            bar.update(1)
            if step % cfg.training.log_freq == 0 or step == cfg.training.steps:
                metrics = {
                    k: v.item() for k, v in output.items() if isinstance(v, torch.Tensor) and v.numel() == 1
                }
                metrics.update(
                    grad_norm=float(grad_norm),
                    lr=scheduler.get_last_lr()[0],
                    data_s=data_s / window,
                    update_s=update_s / window,
                    samples_per_s=batch_size * window / max(data_s + update_s, 1e-9),
                )
                logger.log(step, metrics)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.1e}")
                data_s = update_s = 0.0
                window = 0
            if step % cfg.training.save_freq == 0 or step == cfg.training.steps:
                checkpoint()
            if cfg.eval.freq > 0 and (step % cfg.eval.freq == 0 or step == cfg.training.steps):
                with _ema_weights(policy, ema):
                    info = run_evaluation(cfg, policy, step, run_dir, logger)
                agg = info["aggregated"]
                bar.write(
                    f"step {step}: eval pc_success={agg['pc_success']:.1f} avg_max_reward={agg['avg_max_reward']:.3f}"
                )
    finally:
        bar.close()
        logger.close()
    return run_dir
