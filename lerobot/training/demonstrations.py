"""The demonstrations an online run mixes into its batches (`training.offline_ratio` > 0): the training split
of the env's dataset as a second replay buffer (`load_demonstrations`), and the batches drawn from both
(`sample_mixed`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from lerobot.config import EnvConfig, PolicyConfig
from lerobot.constants import (
    ACTION,
    EPISODE_INDEX,
    FROM_DEMONSTRATIONS,
    NEXT_REWARD,
    REPLAY_INDEX,
    SAMPLE_WEIGHT,
)
from lerobot.training.replay_buffer import ReplayBuffer

log = logging.getLogger(__name__)


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


def run_demonstrations(
    cfg: DictConfig, env_cfg: EnvConfig, policy_cfg: PolicyConfig
) -> tuple[ReplayBuffer | None, dict[str, Any] | None]:
    """The demonstrations of the run (`load_demonstrations`) and their fingerprint, which its checkpoints
    record; (None, None) when its batches mix in none. A resumed run must read the checkpoint's
    (`RunDir.resume`)."""
    if cfg.training.offline_ratio <= 0:
        return None, None
    from lerobot.datasets import dataset_fingerprint

    demos = load_demonstrations(cfg, env_cfg, sorted(policy_cfg.input_features))
    data = dataset_fingerprint(cfg.dataset)
    return demos, data


def sample_mixed(
    online: ReplayBuffer,
    offline: ReplayBuffer | None,
    batch_size: int,
    horizon: int,
    offline_ratio: float,
) -> dict[str, Tensor]:
    """A batch with `round(batch_size * offline_ratio)` samples from `offline` and the rest from `online`,
    in that order: online rows first. `FROM_DEMONSTRATIONS` (B,) marks the rows drawn from `offline`.
    When `online` replays by priority, the demonstration rows (drawn uniformly) get weight 1 and index -1."""
    n_off = round(batch_size * offline_ratio) if offline is not None and len(offline) > 0 else 0
    n_on = batch_size - n_off
    parts = []
    if n_on > 0:
        parts.append(online.sample(n_on, horizon))
    if n_off > 0:
        parts.append(offline.sample(n_off, horizon))
        if online.prioritized:
            parts[-1][SAMPLE_WEIGHT] = torch.ones(n_off)
            parts[-1][REPLAY_INDEX] = torch.full((n_off, 2), -1, dtype=torch.int64)
    batch = parts[0] if len(parts) == 1 else {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    batch[FROM_DEMONSTRATIONS] = torch.arange(batch_size) >= n_on
    return batch
