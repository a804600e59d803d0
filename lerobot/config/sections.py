"""Reading the sections of a composed, saved or validated run config: the `policy` section as a plain dict,
the env and policy sections as their dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.config.policy import PolicyConfig
from lerobot.config.schema import EnvConfig
from lerobot.errors import ConfigError


def policy_section(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """The `policy` section of a composed, saved or validated config as a plain dict, without the env's
    features (the env section holds them); None when it has none."""
    section = cfg.get("policy")
    if not section:
        return None
    section = (
        OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    )
    section.pop("input_features", None)
    section.pop("output_features", None)
    return section


def policy_config(cfg: DictConfig) -> PolicyConfig:
    """The validated run config's policy config as its dataclass (e.g. `DiffusionConfig`), as validation
    built it."""
    if not cfg.policy:
        raise ConfigError("the config names no policy: pass policy=<name> (e.g. policy=diffusion)")
    kind = OmegaConf.get_type(cfg.policy)
    if not (isinstance(kind, type) and issubclass(kind, PolicyConfig)):
        raise ConfigError(
            "the policy section is not validated yet: build the config with validate_run_config"
        )
    return OmegaConf.to_object(cfg.policy)


def env_config(cfg: DictConfig) -> EnvConfig:
    """The env section as a typed `EnvConfig` object (with its helper methods)."""
    return OmegaConf.to_object(cfg.env) if isinstance(cfg.env, DictConfig) else cfg.env
