"""Structured configuration: the schema every Hydra config is validated against at start-up.

The dataclasses of `schema` (and each policy's configuration dataclass, a `policy.PolicyConfig`) are the one
source of every default: `configs/` holds only the choices (`env/*.yaml`; `policy/*.yaml` optionally, for
named variants) and values that differ from a default. A composed config is merged into `RootConfig`, so an
unknown key or a wrong type fails before any work starts, with a message that names the key (`validation`);
the merged result holds every field, resolved, including the `policy` section (validated by the chosen
policy's own dataclass, see `lerobot.policy_registry`). `sections` reads a config's sections, `upgrade` moves
the keys of a config saved by an older version to today's places, `differences` compares two configs.

This package is the public config API: `from lerobot.config import X` for every name below.
"""

from lerobot.config.differences import config_differences
from lerobot.config.policy import NO_TRAINING, OFFLINE, ONLINE, PIECEWISE_SCHEDULE, PolicyConfig
from lerobot.config.schema import (
    CONFIG_DIR,
    INFERENCE_DTYPES,
    RECIPE_ENV,
    RECIPES,
    WHOLE_OBSERVATION,
    DatasetConfig,
    EnvConfig,
    EvalConfig,
    FeatureConfig,
    InferenceConfig,
    RootConfig,
    TrainingConfig,
    WandbConfig,
)
from lerobot.config.sections import env_config, policy_config, policy_section
from lerobot.config.upgrade import old_inference_keys_error, upgrade_saved_config
from lerobot.config.validation import (
    DEVICE_PATTERN,
    ENV_NAME_PATTERN,
    FEATURE_KINDS,
    NON_NEGATIVE_KEYS,
    ONLINE_RATES,
    POSITIVE_KEYS,
    REPO_ID_PATTERN,
    check_repo_id,
    merge_schema,
    validate_config,
)

__all__ = [
    "CONFIG_DIR",
    "DEVICE_PATTERN",
    "ENV_NAME_PATTERN",
    "FEATURE_KINDS",
    "INFERENCE_DTYPES",
    "NON_NEGATIVE_KEYS",
    "NO_TRAINING",
    "OFFLINE",
    "ONLINE",
    "ONLINE_RATES",
    "PIECEWISE_SCHEDULE",
    "POSITIVE_KEYS",
    "RECIPES",
    "RECIPE_ENV",
    "REPO_ID_PATTERN",
    "WHOLE_OBSERVATION",
    "DatasetConfig",
    "EnvConfig",
    "EvalConfig",
    "FeatureConfig",
    "InferenceConfig",
    "PolicyConfig",
    "RootConfig",
    "TrainingConfig",
    "WandbConfig",
    "check_repo_id",
    "config_differences",
    "env_config",
    "merge_schema",
    "old_inference_keys_error",
    "policy_config",
    "policy_section",
    "upgrade_saved_config",
    "validate_config",
]
