"""Validating a composed run config: merged into the `RootConfig` schema (an unknown key or a wrong type
is one `ConfigError` naming the key), then every value checked before any work starts."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lerobot.config.schema import RECIPES, WHOLE_OBSERVATION, EnvConfig, RootConfig
from lerobot.config.sections import env_config, policy_section
from lerobot.config.upgrade import observation_keys_of_env_yaml, old_inference_keys_error
from lerobot.constants import ACTION_KIND, ENV_STATE, EVAL_SCHEDULES, STATE, TASK, VISUAL
from lerobot.errors import ConfigError

FEATURE_KINDS = (VISUAL, STATE, ENV_STATE, TASK, ACTION_KIND)
# Values `device` accepts (resolved by `lerobot.distributed.resolve_device`).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?|mps")
# `dataset.repo_id`: `<owner>/<name>`, each part of letters, digits, `_`, `-` and `.` that starts and ends
# with a letter, digit or `_` (the hub's rule); with no `..` or `--` in it (`check_repo_id`).
REPO_ID_PATTERN = re.compile(r"(?!.*(\.\.|--))[\w](?:[\w.-]*\w)?/[\w](?:[\w.-]*\w)?", re.ASCII)
# `env.name`: one file name (it names the default run and evaluation directories, `<time>_<env>_<policy>`).
ENV_NAME_PATTERN = re.compile(r"\w[\w.-]*", re.ASCII)
# The `EnvConfig` fields every env config states (they have no default).
ENV_REQUIRED_KEYS = ("name", "gym_id", "fps", "max_episode_steps")


def validate_config(cfg: DictConfig | dict) -> DictConfig:
    """Merge a composed config into the `RootConfig` schema and check values; raise `ConfigError` if bad.

    Every default of the root sections is filled in. The `policy` section is left out (`policy` is None): it is
    checked, completed and typed by its registered dataclass in `lerobot.policy_registry.validate_run_config`,
    which calls this first.
    """
    section = policy_section(cfg)
    # `policy.inference.fast=true` is the old place of the inference settings (a checkpoint's is moved at load).
    if section is not None and "inference" in section:
        old = section["inference"]
        raise old_inference_keys_error(old if isinstance(old, Mapping) else {})
    rest = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    rest.pop("policy", None)
    merged = merge_schema(RootConfig, rest, "config")
    unset = [f"env.{key}" for key in ENV_REQUIRED_KEYS if merged.env[key] is None]
    if unset:
        raise ConfigError(
            f"{', '.join(unset)} not set: every env config (configs/env/NAME.yaml) states "
            f"{', '.join(ENV_REQUIRED_KEYS)}"
        )
    if not ENV_NAME_PATTERN.fullmatch(str(merged.env.name)):
        raise ConfigError(
            f"env.name={merged.env.name!r} is not a plain name (letters, digits, '_', '-', '.'): it names "
            "the run's directory (<time>_<env>_<policy>); pick one without '/'"
        )
    for key, feat in merged.env.features.items():
        if feat.kind not in FEATURE_KINDS:
            raise ConfigError(f"env.features.{key}.kind={feat.kind!r}: expected one of {FEATURE_KINDS}")
    if not env_config(merged).output_features():
        raise ConfigError(f"env {merged.env.name!r} declares no feature of kind 'action'")
    if not merged.env.observation_keys:
        merged.env.observation_keys = observation_keys_of_env_yaml(merged.env.name)
    _check_observation_keys(env_config(merged))
    _check_positive(merged)
    reward_range = env_config(merged).reward_range
    if reward_range is not None and (len(reward_range) != 2 or not reward_range[0] < reward_range[1]):
        raise ConfigError(
            f"env.reward_range={list(reward_range)} must be [low, high] with low < high, or null"
        )
    if merged.eval.step_timeout_s is not None and merged.eval.step_timeout_s <= 0:
        raise ConfigError(
            f"eval.step_timeout_s={merged.eval.step_timeout_s} must be a positive number or null"
        )
    _check_online_rates(merged.training)
    if merged.eval.schedule not in EVAL_SCHEDULES:
        raise ConfigError(
            f"eval.schedule={merged.eval.schedule!r}: expected one of {', '.join(EVAL_SCHEDULES)}"
        )
    _check_eval_batch_size(merged)
    for key in ("eval.use_async_envs", "training.resume", "training.use_amp"):
        value = str(OmegaConf.select(merged, key)).lower()
        if value not in ("auto", "true", "false"):
            raise ConfigError(f"{key}={value!r}: expected auto, true or false")
        OmegaConf.update(merged, key, value)
    if not DEVICE_PATTERN.fullmatch(str(merged.device)):
        raise ConfigError(f"device={merged.device!r}: expected auto, cpu, cuda, cuda:N or mps")
    if merged.recipe not in RECIPES:
        raise ConfigError(f"recipe={merged.recipe}: expected one of {', '.join(RECIPES)}")
    if merged.dataset.repo_id is not None:
        check_repo_id(merged.dataset.repo_id)
    OmegaConf.to_object(merged.inference).validate()
    return merged


def check_repo_id(repo_id: str) -> None:
    """Raise `ConfigError` unless `dataset.repo_id` is a hub id `<owner>/<name>` (`REPO_ID_PATTERN`).

    The id names directories (`$HF_LEROBOT_HOME/<repo_id>`, `<cache_dir>/lerobot_datasets/<repo_id>`), so an
    absolute path, a `..` or an empty part would put them, and the conversion that replaces one, elsewhere.
    """
    if not REPO_ID_PATTERN.fullmatch(str(repo_id)):
        raise ConfigError(
            f"dataset.repo_id={repo_id!r} is not a hub id <owner>/<name> (e.g. lerobot/pusht: two non-empty "
            "parts of letters, digits, '_', '-', '.', without '..'); a dataset directory goes in "
            "dataset.root=DIR"
        )


# Keys that must be positive, and those that may also be 0 (what 0 means is in the field's comment).
POSITIVE_KEYS = (
    "eval.n_episodes",
    "training.steps",
    "training.log_freq",
    "training.save_freq",
    "training.n_envs",
    "training.train_freq",
    "training.buffer_capacity",
    "training.grad_clip_norm",
    "training.collective_timeout_s",
    "env.max_episode_steps",
)
NON_NEGATIVE_KEYS = ("training.num_workers", "eval.freq", "eval.max_episodes_rendered", "eval.start_seed")


def _check_positive(cfg: DictConfig) -> None:
    """Counts, periods and sizes are checked before any work starts: a zero or negative one would either
    crash deep inside training or silently mean something else (batch_size=0 read as "the default")."""
    for key in POSITIVE_KEYS:
        if not OmegaConf.select(cfg, key) > 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be a positive number")
    for key in NON_NEGATIVE_KEYS:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be 0 or a positive number")
    batch_size = cfg.training.batch_size
    if batch_size is not None and batch_size < 1:
        raise ConfigError(
            f"training.batch_size={batch_size} must be a positive number (or null for the policy's default)"
        )
    keep = cfg.training.keep_checkpoints
    if keep is not None and keep < 1:
        raise ConfigError(
            f"training.keep_checkpoints={keep} must be a positive number (or null to keep every checkpoint)"
        )


# The online trainer's rates and exponents, (low, high, what the bounds mean) each: a NaN passes every
# comparison (a NaN `per_alpha` read as "not > 0" silently replayed uniformly), so each must be finite too.
ONLINE_RATES = {
    "per_alpha": (0.0, math.inf, "0: uniform replay"),
    "per_beta": (0.0, 1.0, "1: full bias correction"),
    "offline_ratio": (0.0, 1.0, "0: online experience only"),
    "utd_ratio": (0.0, math.inf, "or null for training.gradient_steps"),
}


def _check_online_rates(training: DictConfig) -> None:
    """Each of `ONLINE_RATES` is a finite number within its bounds (`utd_ratio` may be null)."""
    for key, (low, high, meaning) in ONLINE_RATES.items():
        value = training[key]
        if value is None and key == "utd_ratio":
            continue
        if not (math.isfinite(value) and low <= value <= high):
            bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise ConfigError(f"training.{key}={value} must be a finite number {bounds} ({meaning})")


def _check_eval_batch_size(cfg: DictConfig) -> None:
    """`eval.batch_size` is a positive number of envs or `auto` (any case; stored as `auto`)."""
    value = cfg.eval.batch_size
    if str(value).lower() == "auto":
        cfg.eval.batch_size = "auto"
    elif isinstance(value, str) or value < 1:
        raise ConfigError(f"eval.batch_size={value} must be a positive number (of envs) or auto")


def _check_observation_keys(env: EnvConfig) -> None:
    """Every observation feature comes from exactly one env observation path, and every path feeds one."""
    inputs = env.input_features()
    seen: dict[str, str] = {}
    for path, key in env.observation_keys.items():
        if key not in inputs:
            raise ConfigError(
                f"env.observation_keys.{path}={key!r} is not an observation feature of env {env.name!r}; "
                f"declare it under env.features or map the path to one of {sorted(inputs)}"
            )
        if key in seen:
            raise ConfigError(f"env.observation_keys: {seen[key]!r} and {path!r} both map to {key!r}")
        seen[key] = path
    if WHOLE_OBSERVATION in env.observation_keys and len(env.observation_keys) > 1:
        raise ConfigError(
            f"env.observation_keys: {WHOLE_OBSERVATION!r} (the whole observation) cannot be combined with other paths"
        )
    for key in inputs:
        if key not in seen:
            raise ConfigError(
                f"env.observation_keys maps nothing to feature {key!r} of env {env.name!r}; add "
                f"`<observation path>: {key}` (e.g. `agent_pos: {key}`, or `.: {key}` for an array observation)"
            )


def merge_schema(schema: type, section: Any, name: str, key_prefix: str = "") -> DictConfig:
    """`section` merged into the dataclass `schema`, its defaults filled in; an unknown key or a wrong type
    is one `ConfigError`: "invalid <name> at <key_prefix><key>: <OmegaConf's first line>"."""
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), section)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at {key_prefix}{key}" if key else ""
        raise ConfigError(f"invalid {name}{where}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]
