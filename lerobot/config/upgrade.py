"""Configs in an older version's keys: a saved run config (a checkpoint's `config.yaml`) upgraded in place
to today's, and the one-line error for old keys given on the command line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.config.schema import CONFIG_DIR
from lerobot.errors import ConfigError


def old_inference_keys_error(settings: Mapping[str, Any]) -> ConfigError:
    """The error for `settings` (`{field: value}`) given under `policy.inference`, where they were until they
    became the run's `inference` section: it names the keys to write instead."""
    new = " ".join(f"inference.{key}={_override_text(value)}" for key, value in settings.items())
    return ConfigError(
        f"policy.inference.* is now the top-level inference.* section: write {new or 'inference.*'}"
    )


def _override_text(value: Any) -> str:
    """`value` as a command-line override writes it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def observation_keys_of_env_yaml(name: str) -> dict[str, str]:
    """The mapping of `configs/env/<name>.yaml`, for configs saved before `observation_keys` existed."""
    path = CONFIG_DIR / "env" / f"{name}.yaml"
    if not path.is_file():
        return {}
    return dict(OmegaConf.load(path).get("observation_keys", {}))


# The flat keys of a saved `policy` section that held these settings before `policy.inference` was a
# section, and the `InferenceConfig` field each one is.
_FLAT_KEYS = {
    "inference_fast_path": "fast",
    "inference_dtype": "dtype",
    "inference_int8_weights": "int8_weights",
    "inference_compile": "compile",
}


def upgrade_saved_config(cfg: DictConfig) -> DictConfig:
    """Move, in place, the inference settings of a run config saved by an older version (a checkpoint's
    `config.yaml`) to the top-level `inference` section; returns `cfg`.

    They were the `policy.inference` section, and before that the flat `policy.inference_*` keys
    (`inference_autocast: true` was `dtype: bfloat16`). A config that holds neither is left as it is.
    """
    policy = cfg.get("policy")
    if not isinstance(policy, DictConfig):
        return cfg
    flat = {key: policy.pop(key) for key in [*_FLAT_KEYS, "inference_autocast"] if key in policy}
    section = dict(policy.pop("inference", None) or {})
    section.update({field: flat[key] for key, field in _FLAT_KEYS.items() if key in flat})
    if flat.get("inference_autocast"):
        section["dtype"] = "bfloat16"
    if section:
        cfg.inference = {**section, **cfg.get("inference", {})}
    return cfg
