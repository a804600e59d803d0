"""Trainers: offline (demonstrations) and online (replay buffer), sharing the update (`update.py`), the run
directory (`run_dir.py`), the loop's progress (`progress.py`), the metrics log (`metrics.py`) and the divergence
guard (`guard.py`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lerobot import distributed
from lerobot.config import OFFLINE, ONLINE, policy_config
from lerobot.errors import ConfigError
from lerobot.training.offline import train_offline
from lerobot.training.online import train_online


def train(cfg: DictConfig) -> Path:
    """Train the configured policy (offline or online by its `training_mode`); return the run directory.

    The policy config (typed and validated by `validate_run_config`) is handed to the trainer, which holds
    the run directory's lock while it trains (`run_directory`).
    """
    policy_cfg = policy_config(cfg)
    if policy_cfg.training_mode not in (OFFLINE, ONLINE):
        raise ConfigError(f"policy {policy_cfg.name!r} is not trainable (evaluate it with scripts/eval.py)")
    if policy_cfg.training_mode == ONLINE and distributed.world_size() > 1:
        raise ConfigError(
            f"policy {policy_cfg.name!r} learns online and trains on one process only, but "
            f"{distributed.world_size()} were launched; run it without torchrun (or with --nproc_per_node 1)"
        )
    if policy_cfg.training_mode == OFFLINE:
        return train_offline(cfg, policy_cfg)
    return train_online(cfg, policy_cfg)
