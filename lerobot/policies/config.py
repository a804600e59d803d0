"""`PolicyConfig`: the fields every policy's configuration dataclass shares.

A policy's own dataclass (e.g. `DiffusionConfig`) subclasses this, overrides defaults and adds its
architecture fields. `input_features` / `output_features` are filled from the env config by
`lerobot.policies.factory`, so model code reads shapes from them and never hard-codes a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from lerobot.config import FeatureConfig
from lerobot.errors import ConfigError

OFFLINE = "offline"  # learns from a dataset of demonstrations
ONLINE = "online"  # learns from its own experience (replay buffer)
NO_TRAINING = "none"  # baselines


@dataclass
class PolicyConfig:
    """Shared policy settings: history/queue lengths, features, optimiser and EMA defaults."""

    name: str = ""
    n_obs_steps: int = 1
    n_action_steps: int = 1
    input_features: dict[str, FeatureConfig] = field(default_factory=dict)
    output_features: dict[str, FeatureConfig] = field(default_factory=dict)

    # Training defaults; `training.batch_size` overrides `batch_size` when set.
    training_mode: str = NO_TRAINING
    batch_size: int = 64
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = (0.9, 0.999)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.0
    scheduler_name: str = "constant"  # any name diffusers.optimization.get_scheduler accepts
    scheduler_warmup_steps: int = 0
    use_ema: bool = False
    ema_power: float = 0.75
    ema_max_decay: float = 0.9999

    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent values; subclasses extend it (call super)."""
        if self.n_obs_steps < 1 or self.n_action_steps < 1:
            raise ConfigError(
                f"policy.n_obs_steps={self.n_obs_steps} and policy.n_action_steps={self.n_action_steps} must be >= 1"
            )
        if not self.output_features:
            raise ConfigError(f"policy {self.name!r} has no output (action) feature")
        if self.batch_size < 1:
            raise ConfigError(f"policy.batch_size={self.batch_size} must be >= 1")
        if not self.optimizer_lr > 0:
            raise ConfigError(f"policy.optimizer_lr={self.optimizer_lr} must be a positive number")

    @property
    def action_dim(self) -> int:
        """Size of the (single) action feature."""
        (feature,) = self.output_features.values()
        return feature.shape[0]

    def delta_timestamps(self, fps: int) -> dict[str, list[float]] | None:
        """Offsets (seconds) of the dataset frames one training sample needs, per feature; None if none."""
        return None

    @classmethod
    def upgrade_saved(cls, section: DictConfig) -> DictConfig:
        """Rewrite, in place, the keys of a `policy` section saved by an older version (a checkpoint's
        `config.yaml`) into today's; none by default. Returns `section`."""
        return section
