"""`PolicyConfig`, the fields every policy's configuration dataclass shares (history and queue lengths,
features, optimiser, schedule and EMA defaults), its checks, and the kinds of training a policy declares."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from lerobot.config.schema import FeatureConfig
from lerobot.constants import ENV_STATE, STATE, TASK, VISUAL
from lerobot.errors import ConfigError

OFFLINE = "offline"  # learns from a dataset of demonstrations
ONLINE = "online"  # learns from its own experience (replay buffer)
NO_TRAINING = "none"  # baselines


# diffusers' step-wise constant schedule, the one that takes `scheduler_step_rules`.
PIECEWISE_SCHEDULE = "piecewise_constant"


def _step_rules_are_valid(rules: str) -> bool:
    """Whether `rules` reads "m1:u1,...,m": positive factors, increasing positive updates."""
    *pieces, last = rules.split(",")
    try:
        pairs = [piece.split(":") for piece in pieces]
        factors = [float(f) for f, _ in pairs] + [float(last)]
        updates = [int(u) for _, u in pairs]
    except ValueError:  # a number that does not parse, or a piece that is not one factor:update pair
        return False
    return min(factors) > 0 and all(u > 0 for u in updates) and updates == sorted(set(updates))


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
    batch_size: int | None = 64
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = (0.9, 0.999)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.0
    scheduler_name: str = "constant"  # any name diffusers.optimization.get_scheduler accepts
    scheduler_warmup_steps: int = 0
    # With scheduler_name=piecewise_constant: "m1:u1,m2:u2,...,m" scales the rate by m1 before update u1,
    # by m2 from u1 to u2, ..., and by m from the last u on. Updates, not env transitions, for an online policy.
    scheduler_step_rules: str | None = None
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
        if self.scheduler_step_rules is not None and not _step_rules_are_valid(self.scheduler_step_rules):
            raise ConfigError(
                f"policy.scheduler_step_rules={self.scheduler_step_rules!r}: expected 'factor:update,...,factor' "
                "with positive factors and increasing positive updates, e.g. '1:42500,0.1' (the full rate for "
                "42,500 updates, then a tenth)"
            )
        if (self.scheduler_name == PIECEWISE_SCHEDULE) != (self.scheduler_step_rules is not None):
            raise ConfigError(
                f"policy.scheduler_step_rules={self.scheduler_step_rules!r} and "
                f"policy.scheduler_name={self.scheduler_name!r}: step rules go with "
                f"scheduler_name={PIECEWISE_SCHEDULE} and it needs them; set both or neither"
            )
        if self.scheduler_step_rules is not None and self.scheduler_warmup_steps:
            raise ConfigError(
                f"policy.scheduler_warmup_steps={self.scheduler_warmup_steps}: the {PIECEWISE_SCHEDULE} "
                "schedule has no warm-up; set it to 0, or start the step rules with a small factor"
            )

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
    def task_feature(self) -> tuple[str, int] | None:
        """`(key, number of task ids)` of the `task` input (a multi-task env's task index, a scalar per
        step with ids 0 .. high), or None. The count comes from the feature's declared `high`."""
        found = [(k, f) for k, f in self.input_features.items() if f.kind == TASK]
        if not found:
            return None
        if len(found) > 1 or list(found[0][1].shape) != [] or not found[0][1].high:
            raise ConfigError(
                f"{self.name} policy takes one scalar 'task' input (shape []) with its highest id as `high`, got "
                f"{[(k, f.shape, f.high) for k, f in found]}"
            )
        key, feature = found[0]
        return key, int(max(feature.high)) + 1

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
