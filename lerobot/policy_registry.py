"""Policy registry: name -> configuration dataclass, policy class and optional inference layer.

A policy is added with one call (paths are imported only when the policy is used):

    register_policy("mine", config="my_pkg.config:MyConfig", policy="my_pkg.model:MyPolicy")

after which `policy=mine` works on the command line; a YAML file in `configs/policy/` is optional (the
dataclass holds the defaults). An inference layer is named here by its path only: `lerobot.accel`, a layer
above the policies, imports and enters it.

The registry sits below the `Policy` base class and `lerobot.checkpoints`, which build policies through it:
it names the policy classes by path and imports none of them until one is made.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from lerobot.config import (
    EnvConfig,
    InferenceConfig,
    PolicyConfig,
    env_config,
    merge_schema,
    policy_section,
    validate_config,
)
from lerobot.errors import ConfigError, InstallError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyEntry:
    """Import paths ("module:attribute") of one registered policy."""

    config: str
    policy: str
    # A function `(policy, InferenceConfig) -> context manager` entered around evaluation (e.g. a faster
    # inference mode), by `lerobot.accel.accelerated`.
    inference: str | None = None


_REGISTRY: dict[str, PolicyEntry] = {}
# A policy's former registry name -> its name now: a command line or a saved config (a checkpoint's) that
# names the former still works, with one log line (`current_policy_name`).
RENAMED_POLICIES = {"scripted": "pusht_scripted"}


def register_policy(name: str, config: str, policy: str, inference: str | None = None) -> None:
    """Register a policy under `name` (what `policy=<name>` selects).

    Args:
        name: the policy's name; its config dataclass's `name` field must default to it.
        config: "module:ConfigClass", a `PolicyConfig` subclass.
        policy: "module:PolicyClass", a `Policy` subclass taking `(config, dataset_stats=None)`.
        inference: optional "module:function" taking the policy and the run's `inference` settings
            (`lerobot.config.InferenceConfig`) and returning a context manager that evaluation enters (see
            `lerobot.accel.accelerated`; this registry never imports it).

    Registering the same name again with the same paths is a no-op; with other paths it is an error.
    """
    for path in (config, policy, inference):
        if path is not None and path.count(":") != 1:
            raise ValueError(f"register_policy({name!r}): {path!r} is not a 'module:attribute' path")
    entry = PolicyEntry(config, policy, inference)
    if _REGISTRY.get(name, entry) != entry:
        raise ValueError(f"policy {name!r} is already registered as {_REGISTRY[name]}")
    _REGISTRY[name] = entry


def available_policies() -> list[str]:
    """Names of the registered policies, sorted."""
    return sorted(_REGISTRY)


def current_policy_name(name: Any) -> Any:
    """`name`, or the name now of a renamed policy (`RENAMED_POLICIES`), which is said once per process."""
    if name not in RENAMED_POLICIES:
        return name
    _say_renamed(name, RENAMED_POLICIES[name])
    return RENAMED_POLICIES[name]


@functools.cache
def _say_renamed(old: str, new: str) -> None:
    log.warning("policy=%s is now policy=%s; the old name still works", old, new)


def _import(path: str) -> Any:
    module, name = path.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, RuntimeError) as e:
        # A torchvision built for another torch (e.g. `pip install -e .` before torch's CPU build) fails in
        # its own import, deep in a traceback: `operator torchvision::nms does not exist`.
        if "torchvision" not in str(e):
            raise
        raise InstallError(_torchvision_mismatch(e)) from None


def _torchvision_mismatch(error: BaseException) -> str:
    """The line for a torchvision that does not load with the installed torch; `error` says why it did not."""
    import torch

    try:
        vision = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        vision = "(not installed)"
    why = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (
        f"torchvision {vision} does not load with torch {torch.__version__} ({why}): install the two from one "
        "build, e.g. pip install --force-reinstall torch torchvision --index-url "
        "https://download.pytorch.org/whl/cpu on a machine without a GPU (README, Quick start)"
    )


def _entry(name: Any) -> PolicyEntry:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown policy {name!r}; available: {', '.join(available_policies())}")
    return _REGISTRY[name]


def policy_config_class(name: str) -> type[PolicyConfig]:
    """The configuration dataclass registered for policy `name` (imported now)."""
    return _import(_entry(name).config)


def make_policy_config(policy_section: DictConfig | dict, env_cfg: EnvConfig) -> PolicyConfig:
    """Validate the `policy` config section against its dataclass and attach the env's features.

    A renamed policy's former name (`RENAMED_POLICIES`) is read as its name now. Raises `ConfigError` for an
    unknown policy name, unknown keys, wrong types or features the policy cannot use.
    """
    section = (
        OmegaConf.to_container(policy_section, resolve=True)
        if isinstance(policy_section, DictConfig)
        else dict(policy_section)
    )
    section["name"] = current_policy_name(section.get("name"))
    config_cls = policy_config_class(section["name"])
    section.pop("input_features", None)
    section.pop("output_features", None)
    cfg: PolicyConfig = OmegaConf.to_object(merge_schema(config_cls, section, "policy config", "policy."))
    cfg.input_features = env_cfg.input_features()
    cfg.output_features = env_cfg.output_features()
    cfg.resolve_defaults()
    cfg.validate()
    return cfg


def validate_run_config(cfg: DictConfig | dict) -> DictConfig:
    """`lerobot.config.validate_config`, then the `policy` section (when it names a policy) validated,
    completed with every field of its dataclass and the env's features, and typed by that dataclass: the
    complete, resolved config that checkpoints save (`lerobot.config.policy_config` reads it)."""
    merged = validate_config(cfg)
    section = policy_section(cfg)
    if section:
        merged.policy = OmegaConf.structured(make_policy_config(section, env_config(merged)))
        check_inference_settings(merged.policy.name, OmegaConf.to_object(merged.inference))
    return merged


def policy_class(name: str) -> type[nn.Module]:
    """The policy class registered as `name`, its module imported now (so that a command can meet an
    installation that cannot run it, `InstallError`, at start-up rather than when the policy is built)."""
    return _import(_entry(name).policy)


def make_policy(policy_cfg: PolicyConfig, dataset_stats: dict | None = None) -> nn.Module:
    """An instance of the policy class registered for `policy_cfg.name` (a `lerobot.policies.policy.Policy`;
    this registry sits below the base class, which loads saved policies through it)."""
    return policy_class(policy_cfg.name)(policy_cfg, dataset_stats=dataset_stats)


def inference_layer(name: str) -> str | None:
    """The "module:function" path of the inference layer registered for policy `name`; None when it has none
    (or `name` is not registered)."""
    entry = _REGISTRY.get(name)
    return entry.inference if entry is not None else None


def check_inference_settings(name: str, settings: InferenceConfig) -> None:
    """Raise `ConfigError` when `settings` (the run's `inference` section) ask for more than the defaults of
    policy `name`, which has no inference layer to do it."""
    if inference_layer(name) is not None:
        return
    default = InferenceConfig()
    changed = [
        f"inference.{f.name}"
        for f in dataclasses.fields(settings)
        if getattr(settings, f.name) != getattr(default, f.name)
    ]
    if changed:
        layers = sorted(n for n, entry in _REGISTRY.items() if entry.inference is not None)
        raise ConfigError(
            f"{', '.join(changed)}: policy {name!r} has no inference layer (policies with one: "
            f"{', '.join(layers) or 'none'}); leave the inference settings at their defaults"
        )


register_policy(
    "random",
    config="lerobot.policies.baselines:RandomConfig",
    policy="lerobot.policies.baselines:RandomPolicy",
)
register_policy(
    "pusht_scripted",
    config="lerobot.policies.baselines:ScriptedConfig",
    policy="lerobot.policies.baselines:ScriptedPushPolicy",
)
register_policy(
    "metaworld_expert",
    config="lerobot.policies.metaworld_expert:MetaWorldExpertConfig",
    policy="lerobot.policies.metaworld_expert:MetaWorldExpertPolicy",
)
register_policy(
    "diffusion",
    config="lerobot.policies.diffusion.configuration:DiffusionConfig",
    policy="lerobot.policies.diffusion.modeling:DiffusionPolicy",
    inference="lerobot.accel.diffusion:fast_inference_context",
)
register_policy(
    "tdmpc",
    config="lerobot.policies.tdmpc.configuration:TDMPCConfig",
    policy="lerobot.policies.tdmpc.modeling:TDMPCPolicy",
)
register_policy(
    "sac",
    config="lerobot.policies.sac.configuration:SACConfig",
    policy="lerobot.policies.sac.modeling:SACPolicy",
)
register_policy(
    "act",
    config="lerobot.policies.act.configuration:ACTConfig",
    policy="lerobot.policies.act.modeling:ACTPolicy",
)
