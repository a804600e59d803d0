"""Feature normalization whose statistics live in the module's state dict.

A policy wraps its inputs in `Normalize` and its outputs in `Unnormalize`. The statistics are registered
buffers, so they are saved with the weights (safetensors checkpoints) and restored by `load_state_dict`;
a checkpoint therefore evaluates without the dataset.

Modes, chosen per feature kind (`visual`, `state`, `env_state`, `action`):

- `"mean_std"`: `(x - mean) / std`, for images per channel (statistics shaped `(C, 1, 1)`).
- `"min_max"`: maps `[min, max]` to `[-1, 1]`.
- a kind missing from `modes` (or mode `"identity"`) passes through unchanged.

Statistics come as `{feature_key: {"mean", "std", "min", "max": Tensor}}` (the dataset's format). When
constructed with `stats=None` (to load a checkpoint next) the buffers start as `inf` and using them before
loading raises "statistics not loaded". With `bounds_fallback=True`, a `min_max` feature without statistics
uses the feature's declared `low`/`high` bounds instead (useful for online RL, where no dataset exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lerobot.config import FeatureConfig
from lerobot.constants import VISUAL

MEAN_STD = "mean_std"
MIN_MAX = "min_max"
IDENTITY = "identity"
NORMALIZATION_MODES = (MEAN_STD, MIN_MAX, IDENTITY)

# Guards the divisions against a zero std or a constant feature (max == min).
_EPS = 1e-8


def stats_shape(feature: FeatureConfig) -> tuple[int, ...]:
    """Shape of a feature's statistics: `(C, 1, 1)` for images (per channel), the feature's shape otherwise."""
    if feature.kind == VISUAL:
        if len(feature.shape) != 3:
            raise ValueError(f"visual features must be (C, H, W), got shape {feature.shape}")
        return (feature.shape[0], 1, 1)
    return tuple(feature.shape)


class _FeatureStats(nn.Module):
    """The statistics of one feature as buffers (`mean`/`std` or `min`/`max`), plus a loaded-check."""

    def __init__(self, key: str, mode: str, shape: tuple[int, ...], values: Mapping[str, Tensor] | None):
        super().__init__()
        self.key = key
        self.mode = mode
        names = ("mean", "std") if mode == MEAN_STD else ("min", "max")
        for name in names:
            buffer = torch.full(shape, torch.inf)
            if values is not None:
                if name not in values:
                    raise KeyError(f"statistics of {key!r} lack {name!r} (needed by mode {mode!r})")
                given = torch.as_tensor(values[name], dtype=torch.float32)
                if given.numel() == 1:
                    given = given.expand(shape)  # one bound for all elements, e.g. `low: [0.0]`
                elif given.numel() != buffer.numel():
                    raise ValueError(
                        f"statistics {key!r}.{name} has shape {tuple(given.shape)}; expected {shape}"
                    )
                buffer = given.reshape(shape).clone()
            self.register_buffer(name, buffer)
        # Checking the buffers for `inf` costs a device sync; do it once, and again after every load.
        self._verified = False
        self.register_load_state_dict_pre_hook(_reset_verified)

    def check_loaded(self) -> None:
        """Raise if the statistics are still the `inf` placeholders of a `stats=None` construction."""
        if self._verified:
            return
        if any(torch.isinf(buffer).any() for buffer in self.buffers()):
            raise RuntimeError(
                f"statistics not loaded: {self.key!r} ({self.mode}) still holds placeholders; pass "
                "dataset statistics to the policy or load a checkpoint (load_state_dict) before use"
            )
        self._verified = True


def _reset_verified(module: _FeatureStats, *args: Any, **kwargs: Any) -> None:
    module._verified = False


def _buffer_name(key: str) -> str:
    # Module names cannot contain dots; batch keys do ("observation.image").
    return key.replace(".", "_")


class _Normalization(nn.Module):
    """Shared construction of `Normalize` / `Unnormalize`: one `_FeatureStats` per normalized feature."""

    def __init__(
        self,
        features: Mapping[str, FeatureConfig],
        modes: Mapping[str, str],
        stats: Mapping[str, Mapping[str, Tensor]] | None = None,
        bounds_fallback: bool = False,
    ):
        super().__init__()
        self.features = dict(features)
        self.modes = dict(modes)
        self.stats = nn.ModuleDict()
        self._keys: dict[str, str] = {}  # batch key -> module name
        for key, feature in features.items():
            mode = modes.get(feature.kind, IDENTITY)
            if mode not in NORMALIZATION_MODES:
                raise ValueError(
                    f"normalization mode {mode!r} for kind {feature.kind!r}: expected {NORMALIZATION_MODES}"
                )
            if mode == IDENTITY:
                continue
            values = None if stats is None else stats.get(key)
            has_bounds = feature.low is not None and feature.high is not None
            if values is None and bounds_fallback and mode == MIN_MAX and has_bounds:
                values = {"min": torch.tensor(feature.low), "max": torch.tensor(feature.high)}
            if values is None and stats is not None:
                raise KeyError(
                    f"no statistics for feature {key!r} (mode {mode!r}); got stats for {sorted(stats)}"
                )
            self.stats[_buffer_name(key)] = _FeatureStats(key, mode, stats_shape(feature), values)
            self._keys[key] = _buffer_name(key)

    def _transform(self, batch: Mapping[str, Tensor], inverse: bool) -> dict[str, Tensor]:
        out = dict(batch)
        for key, name in self._keys.items():
            if key not in batch:
                continue
            stats: _FeatureStats = self.stats[name]
            stats.check_loaded()
            x = batch[key]
            # Buffers broadcast from the right, so any leading dims (B, T, ...) work.
            if stats.mode == MEAN_STD:
                std = stats.std + _EPS
                out[key] = x * std + stats.mean if inverse else (x - stats.mean) / std
            else:
                span = stats.max - stats.min
                # A constant feature (max == min) maps to -1 instead of blowing up.
                span = torch.where(span.abs() < _EPS, torch.ones_like(span), span)
                if inverse:
                    out[key] = (x + 1) / 2 * span + stats.min
                else:
                    out[key] = (x - stats.min) / span * 2 - 1
        return out


class Normalize(_Normalization):
    """Normalize the features of a batch; keys without statistics (or absent) pass through unchanged.

    Args:
        features: `{key: FeatureConfig}` of the features to normalize (shape without batch/time dims).
        modes: `{feature kind: "mean_std" | "min_max" | "identity"}`.
        stats: `{key: {"mean","std","min","max": Tensor}}`; None to load them later from a state dict.
        bounds_fallback: use `FeatureConfig.low/high` for `min_max` features that have no statistics.
    """

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Return a new dict with tensors `(..., *feature_shape)` normalized; other entries are kept as is."""
        return self._transform(batch, inverse=False)


class Unnormalize(_Normalization):
    """Inverse of `Normalize` (same arguments): maps normalized tensors back to the data's units."""

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Return a new dict with tensors `(..., *feature_shape)` unnormalized; other entries are kept as is."""
        return self._transform(batch, inverse=True)
