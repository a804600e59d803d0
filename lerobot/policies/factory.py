"""Policy registry: name -> configuration dataclass and policy class, imported lazily."""

from __future__ import annotations

import importlib
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lerobot.config import ConfigError, EnvConfig
from lerobot.policies.config import PolicyConfig
from lerobot.policies.policy import Policy

# name -> ("module:ConfigClass", "module:PolicyClass")
POLICIES: dict[str, tuple[str, str]] = {
    "random": ("lerobot.policies.baselines:RandomConfig", "lerobot.policies.baselines:RandomPolicy"),
    "scripted": (
        "lerobot.policies.baselines:ScriptedConfig",
        "lerobot.policies.baselines:ScriptedPushPolicy",
    ),
    "diffusion": (
        "lerobot.policies.diffusion.configuration:DiffusionConfig",
        "lerobot.policies.diffusion.modeling:DiffusionPolicy",
    ),
    "tdmpc": (
        "lerobot.policies.tdmpc.configuration:TDMPCConfig",
        "lerobot.policies.tdmpc.modeling:TDMPCPolicy",
    ),
}


def _import(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def make_policy_config(policy_section: DictConfig | dict, env_cfg: EnvConfig) -> PolicyConfig:
    """Validate the `policy` config section against its dataclass and attach the env's features.

    Raises `ConfigError` for an unknown policy name, unknown keys, wrong types or features the policy
    cannot use.
    """
    section = (
        OmegaConf.to_container(policy_section, resolve=True)
        if isinstance(policy_section, DictConfig)
        else dict(policy_section)
    )
    name = section.get("name")
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; available: {', '.join(sorted(POLICIES))}")
    config_cls = _import(POLICIES[name][0])
    section.pop("input_features", None)
    section.pop("output_features", None)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config_cls), section)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at policy.{key}" if key else ""
        raise ConfigError(f"invalid policy config{where}: {str(e).strip().splitlines()[0]}") from None
    cfg: PolicyConfig = OmegaConf.to_object(merged)
    cfg.input_features = env_cfg.input_features()
    cfg.output_features = env_cfg.output_features()
    cfg.validate()
    return cfg


def make_policy(policy_cfg: PolicyConfig, dataset_stats: dict | None = None) -> Policy:
    """Instantiate the policy class registered for `policy_cfg.name`."""
    policy_cls = _import(POLICIES[policy_cfg.name][1])
    return policy_cls(policy_cfg, dataset_stats=dataset_stats)


def policy_config_to_dict(policy_cfg: PolicyConfig) -> dict[str, Any]:
    """The config as a plain dict without the env-derived features (what goes back into `config.yaml`)."""
    skip = {"input_features", "output_features"}
    return {f.name: getattr(policy_cfg, f.name) for f in fields(policy_cfg) if f.name not in skip}
