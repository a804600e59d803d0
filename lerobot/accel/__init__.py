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

from lerobot import distributed
from lerobot.config import InferenceConfig
from lerobot.policies.policy import Policy
from lerobot.policy_registry import check_inference_settings, inference_layer

__all__ = ["InferenceConfig", "accelerated"]


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
    if settings.dtype == "bfloat16":  # a policy with a layer has weights
        device = next(policy.parameters()).device
        distributed.warn_if_bf16_is_slow(device, "inference.dtype=bfloat16", "inference.dtype=float32")
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)(policy, settings)
