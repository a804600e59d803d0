"""Trainers: offline (demonstrations) and online (replay buffer), sharing the update (`update.py`) and the run (`run.py`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lerobot import distributed
from lerobot.config import OFFLINE, ONLINE, policy_config
from lerobot.errors import ConfigError
from lerobot.runtime.files import release_run_dir
from lerobot.training.offline import train_offline
from lerobot.training.online import train_online


def train(cfg: DictConfig) -> Path:
    """Train the configured policy (offline or online by its `training_mode`); return the run directory.

    The policy config (typed and validated by `validate_run_config`) is handed to the trainer. The run
    directory's lock, taken by the trainer's `setup_run`, is released when this returns or raises.
    """
    policy_cfg = policy_config(cfg)
    if policy_cfg.training_mode not in (OFFLINE, ONLINE):
        raise ConfigError(f"policy {policy_cfg.name!r} is not trainable (evaluate it with scripts/eval.py)")
    if policy_cfg.training_mode == ONLINE and distributed.world_size() > 1:
        raise ConfigError(
            f"policy {policy_cfg.name!r} learns online and trains on one process only, but "
            f"{distributed.world_size()} were launched; run it without torchrun (or with --nproc_per_node 1)"
        )
    try:
        if policy_cfg.training_mode == OFFLINE:
            return train_offline(cfg, policy_cfg)
        return train_online(cfg, policy_cfg)
    finally:
        if cfg.output_dir is not None:
            release_run_dir(Path(cfg.output_dir))
