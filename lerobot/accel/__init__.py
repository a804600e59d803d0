"""Accelerated inference: opt-in layers, above the policies, that make evaluation generate actions faster.

What a layer does is the run config's `inference` section (`InferenceConfig`, e.g. `inference.fast=true
inference.dtype=bfloat16`); which layer a policy has is its registration
(`register_policy(..., inference="module:function")`, a path that only this package imports). Evaluation
runs inside `with accelerated(policy, cfg.inference):`. No layer changes the weights or the checkpoint.

Layers:

- `lerobot.accel.diffusion`: Diffusion Policy's chunks from networks prepared for inference (bf16, int8
  weights, `torch.compile`), or its modules under bf16 autocast.

This package may import the policies; nothing in `lerobot.policies` imports it.
"""

from __future__ import annotations

import contextlib
import importlib

from omegaconf import DictConfig, OmegaConf

from lerobot.config import InferenceConfig
from lerobot.policies.factory import check_inference_settings, inference_layer
from lerobot.policies.policy import Policy

__all__ = ["InferenceConfig", "accelerated", "upgrade_saved_config"]


def accelerated(
    policy: Policy, settings: InferenceConfig | DictConfig | None = None
) -> contextlib.AbstractContextManager:
    """The context manager evaluation runs `policy` in: the inference layer registered for its `config.name`,
    applying `settings` (the run config's `inference` section; None: the defaults), else a no-op.

    Raises `ConfigError` for settings the layer cannot run, or that ask a policy without a layer for more
    than the defaults.
    """
    if settings is None:
        settings = InferenceConfig()
    elif isinstance(settings, DictConfig):
        settings = OmegaConf.to_object(settings)
    settings.validate()
    name = policy.config.name
    check_inference_settings(name, settings)
    path = inference_layer(name)
    if path is None:
        return contextlib.nullcontext()
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)(policy, settings)


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
