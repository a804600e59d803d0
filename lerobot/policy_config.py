"""`PolicyConfig`: the fields every policy's configuration dataclass shares.

A policy's own dataclass (e.g. `DiffusionConfig`) subclasses this, overrides defaults and adds its
architecture fields. `input_features` / `output_features` are filled from the env config by
`lerobot.policy_registry`, so model code reads shapes from them and never hard-codes a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from lerobot.config import FeatureConfig
from lerobot.constants import ENV_STATE, STATE, VISUAL
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
    # Temporal ensembling (ACT): predict a chunk at every step and execute the mean of all the predictions
    # made for that step, the i-th oldest weighted by exp(-coeff * i); needs n_action_steps=1. None: off
    # (chunks are queued and executed). See `lerobot.policies.policy.Policy`.
    temporal_ensemble_coeff: float | None = None

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

    def resolve_defaults(self) -> None:
        """Fill the fields whose default depends on the features (left `None` in the dataclass); none by
        default. Called once, by `lerobot.policy_registry.make_policy_config`, before `validate`."""

    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent values, changing nothing; subclasses extend it (call super)."""
        if self.n_obs_steps < 1 or self.n_action_steps < 1:
            raise ConfigError(
                f"policy.n_obs_steps={self.n_obs_steps} and policy.n_action_steps={self.n_action_steps} must be >= 1"
            )
        if not self.output_features:
            raise ConfigError(f"policy {self.name!r} has no output (action) feature")
        if self.temporal_ensemble_coeff is not None:
            if not self.temporal_ensemble_coeff >= 0:
                raise ConfigError(
                    f"policy.temporal_ensemble_coeff={self.temporal_ensemble_coeff} must be >= 0 (or null: off)"
                )
            if self.n_action_steps != 1:
                raise ConfigError(
                    f"policy.temporal_ensemble_coeff={self.temporal_ensemble_coeff} needs policy.n_action_steps=1 "
                    f"(got {self.n_action_steps}): ensembling predicts a chunk at every step"
                )
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"policy.batch_size={self.batch_size} must be >= 1")
        if not self.optimizer_lr > 0:
            raise ConfigError(f"policy.optimizer_lr={self.optimizer_lr} must be a positive number")

    # ------------------------------------------------------------------ features by kind
    @property
    def image_features(self) -> dict[str, list[int]]:
        """`{key: (C, H, W)}` of the visual inputs (cameras), in the order of the input features."""
        return {k: list(f.shape) for k, f in self.input_features.items() if f.kind == VISUAL}

    @property
    def state_feature(self) -> tuple[str, int] | None:
        """`(key, dim)` of the `state` input (the robot's own position), or None."""
        return self._single_vector(STATE)

    @property
    def env_state_feature(self) -> tuple[str, int] | None:
        """`(key, dim)` of the `env_state` input (e.g. keypoints), or None."""
        return self._single_vector(ENV_STATE)

    @property
    def action_key(self) -> str:
        """Batch key of the (single) action feature."""
        (key,) = self.output_features
        return key

    def _single_vector(self, kind: str) -> tuple[str, int] | None:
        found = [(k, f) for k, f in self.input_features.items() if f.kind == kind]
        if not found:
            return None
        if len(found) > 1:
            raise ConfigError(
                f"{self.name} policy takes at most one {kind!r} input, got {[k for k, _ in found]}"
            )
        key, feature = found[0]
        if len(feature.shape) != 1:
            raise ConfigError(f"input feature {key!r} ({kind}) must be a vector, got shape {feature.shape}")
        return key, feature.shape[0]

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
