"""Trainers: offline (demonstrations) and online (replay buffer), sharing the update (`update.py`), the run
directory (`run_dir/`: made or found, locked, resumed or branched, saved into, pruned), the loop's progress
(`progress.py`) and timing (`pace.py`), the metrics log (`metrics.py`) and the divergence guard (`guard.py`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lerobot import distributed
from lerobot.config import OFFLINE, ONLINE, policy_config
from lerobot.errors import ConfigError
from lerobot.evaluation import check_run_env
from lerobot.training.offline import train_offline
from lerobot.training.online import train_online
from lerobot.training.pace import LOWER_STEPS


def train(cfg: DictConfig, slow_run_advice: str = LOWER_STEPS) -> Path:
    """Train the configured policy (offline or online by its `training_mode`); return the run directory.

    The policy config (typed and validated by `validate_run_config`) is handed to the trainer, which holds
    the run directory's lock while it trains (`open_run_dir`). `slow_run_advice` ends the warning of a CPU
    run that would take hours (`CpuPace`): what would be faster.
    """
    policy_cfg = policy_config(cfg)
    if policy_cfg.training_mode not in (OFFLINE, ONLINE):
        raise ConfigError(f"policy {policy_cfg.name!r} is not trainable (evaluate it with scripts/eval.py)")
    if policy_cfg.training_mode == ONLINE and distributed.world_size() > 1:
        raise ConfigError(
            f"policy {policy_cfg.name!r} learns online and trains on one process only, but "
            f"{distributed.world_size()} were launched; run it without torchrun (or with --nproc_per_node 1)"
        )
    # Every env setting, and rendering where the run renders, is checked before anything is written: a bad
    # one would otherwise end the run at its first evaluation, with `env.*` fixed for its resumes.
    check_run_env(cfg, evaluates=cfg.eval.freq > 0)
    if policy_cfg.training_mode == OFFLINE:
        return train_offline(cfg, policy_cfg, slow_run_advice=slow_run_advice)
    return train_online(cfg, policy_cfg, slow_run_advice=slow_run_advice)
