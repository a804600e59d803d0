"""Structured configuration: the schema every Hydra config is validated against at start-up.

`configs/` holds the YAML (defaults, `env/*.yaml`, `policy/*.yaml`); this module holds the types. A composed
config is merged into `RootConfig`, so an unknown key or a wrong type fails before any work starts, with a
message that names the key. The `policy` section is validated by the chosen policy's own dataclass
(see `lerobot.policies.factory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lerobot.constants import ACTION_KIND, ENV_STATE, EVAL_SCHEDULES, STATE, VISUAL

FEATURE_KINDS = (VISUAL, STATE, ENV_STATE, ACTION_KIND)


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and how to fix it."""


@dataclass
class FeatureConfig:
    """One named tensor an env emits or a policy outputs: its shape without batch/time dims and its kind."""

    shape: list[int] = field(default_factory=list)
    kind: str = STATE
    # Optional bounds, one per element or one for all (e.g. the action space); policies without dataset
    # statistics (online RL) normalize with them.
    low: list[float] | None = None
    high: list[float] | None = None


@dataclass
class EnvConfig:
    """A gymnasium task and the features it produces (names, shapes), read by policies and datasets."""

    name: str = "pusht"
    gym_id: str = "gym_pusht/PushT-v0"
    fps: int = 10
    max_episode_steps: int = 300
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    features: dict[str, FeatureConfig] = field(default_factory=dict)

    def input_features(self) -> dict[str, FeatureConfig]:
        """Observation features (everything that is not an action)."""
        return {k: v for k, v in self.features.items() if v.kind != ACTION_KIND}

    def output_features(self) -> dict[str, FeatureConfig]:
        """Action features."""
        return {k: v for k, v in self.features.items() if v.kind == ACTION_KIND}


@dataclass
class DatasetConfig:
    """Where the offline demonstrations live and how they are split."""

    # Directory holding the source data (`pusht_cchi_v7_replay.zarr` or `pusht.zip`); falls back to
    # $LEROBOT_DATA_ROOT, then to a download into `cache_dir`.
    root: str | None = None
    cache_dir: str | None = None
    val_fraction: float = 0.0
    split_seed: int = 0


@dataclass
class TrainingConfig:
    """Optimisation loop settings shared by the offline (dataset) and online (replay buffer) trainers."""

    # Offline: gradient steps. Online: env transitions summed over all envs (Stable-Baselines3 semantics).
    steps: int = 100_000
    # null: the policy's own default (e.g. 64 for image Diffusion Policy, 256 for low-dimensional).
    batch_size: int | None = None
    num_workers: int = 2
    log_freq: int = 100
    save_freq: int = 10_000
    resume: bool = False
    # bf16 autocast for the forward/backward pass (CPU AMX or CUDA).
    use_amp: bool = False
    grad_clip_norm: float = 10.0
    # Online (TD-MPC) only: vectorized envs collecting experience, SB3-style schedule.
    n_envs: int = 1
    use_async_envs: bool = False
    train_freq: int = 1
    gradient_steps: int = 1  # -1: as many updates as transitions just collected
    utd_ratio: float | None = None  # updates per transition; takes precedence over gradient_steps
    learning_starts: int = 1000
    buffer_capacity: int = 1_000_000
    offline_ratio: float = 0.0
    save_buffer: bool = False


@dataclass
class EvalConfig:
    """Batched evaluation: how many episodes, over how many envs at once."""

    n_episodes: int = 50
    batch_size: int = 50
    # "auto" picks sync or async from the env's measured step cost and the core count.
    use_async_envs: str = "auto"
    max_episodes_rendered: int = 4
    start_seed: int = 100_000
    freq: int = 10_000
    # Async envs: fail when a step takes longer (seconds). None waits; a dead worker fails at once anyway.
    step_timeout_s: float | None = None
    # refill | refill_aligned | batch: when a slot whose episode ended starts the next one (lerobot.rollout).
    schedule: str = "refill_aligned"


@dataclass
class WandbConfig:
    """Weights & Biases logging; off by default, `mode: offline` works with no network."""

    enable: bool = False
    project: str = "lerobot"
    mode: str = "offline"
    entity: str | None = None


@dataclass
class RootConfig:
    """The whole run: env, policy, dataset, training, evaluation, logging."""

    env: EnvConfig = field(default_factory=EnvConfig)
    policy: dict[str, Any] = field(default_factory=dict)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    seed: int = 1000
    device: str = "cpu"
    output_dir: str | None = None
    job_name: str | None = None


def validate_config(cfg: DictConfig | dict) -> DictConfig:
    """Merge a composed config into the `RootConfig` schema and check values; raise `ConfigError` if bad."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at {key}" if key else ""
        raise ConfigError(f"invalid config{where}: {_first_line(e)}") from None
    for key, feat in merged.env.features.items():
        if feat.kind not in FEATURE_KINDS:
            raise ConfigError(f"env.features.{key}.kind={feat.kind!r}: expected one of {FEATURE_KINDS}")
    if not env_config(merged).output_features():
        raise ConfigError(f"env {merged.env.name!r} declares no feature of kind 'action'")
    checks = {
        "eval.n_episodes": merged.eval.n_episodes > 0,
        "eval.batch_size": merged.eval.batch_size > 0,
        "training.steps": merged.training.steps >= 0,
        "training.n_envs": merged.training.n_envs > 0,
        "training.train_freq": merged.training.train_freq > 0,
        "env.max_episode_steps": merged.env.max_episode_steps > 0,
    }
    for key, ok in checks.items():
        if not ok:
            raise ConfigError(f"{key}={OmegaConf.select(merged, key)} must be a positive number")
    if merged.eval.step_timeout_s is not None and merged.eval.step_timeout_s <= 0:
        raise ConfigError(
            f"eval.step_timeout_s={merged.eval.step_timeout_s} must be a positive number or null"
        )
    if merged.eval.schedule not in EVAL_SCHEDULES:
        raise ConfigError(
            f"eval.schedule={merged.eval.schedule!r}: expected one of {', '.join(EVAL_SCHEDULES)}"
        )
    if str(merged.eval.use_async_envs).lower() not in ("auto", "true", "false"):
        raise ConfigError(f"eval.use_async_envs={merged.eval.use_async_envs!r}: expected auto, true or false")
    if merged.device not in ("cpu", "cuda", "auto") and not str(merged.device).startswith("cuda:"):
        raise ConfigError(f"device={merged.device!r}: expected cpu, cuda, cuda:N or auto")
    return merged


def env_config(cfg: DictConfig) -> EnvConfig:
    """The env section as a typed `EnvConfig` object (with its helper methods)."""
    return OmegaConf.to_object(cfg.env) if isinstance(cfg.env, DictConfig) else cfg.env


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]
