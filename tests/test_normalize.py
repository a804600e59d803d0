"""Normalization modules: modes, round trip, statistics in the state dict, missing statistics."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from lerobot.config import FeatureConfig
from lerobot.normalize import Normalize, Unnormalize

FEATURES = {
    "observation.image": FeatureConfig(shape=[3, 4, 5], kind="visual"),
    "observation.state": FeatureConfig(shape=[2], kind="state", low=[0.0, 0.0], high=[512.0, 512.0]),
    "action": FeatureConfig(shape=[2], kind="action", low=[0.0], high=[100.0]),
}
MODES = {"visual": "mean_std", "state": "min_max", "action": "min_max"}


def make_stats() -> dict[str, dict[str, torch.Tensor]]:
    return {
        "observation.image": {
            "mean": torch.tensor([0.1, 0.5, 0.9]).view(3, 1, 1),
            "std": torch.tensor([0.2, 0.1, 0.05]).view(3, 1, 1),
        },
        "observation.state": {"min": torch.tensor([10.0, -5.0]), "max": torch.tensor([30.0, 5.0])},
        "action": {"min": torch.tensor([0.0, 100.0]), "max": torch.tensor([50.0, 300.0])},
    }


def make_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "observation.image": torch.rand(4, 2, 3, 4, 5, generator=g),  # (B, T, C, H, W)
        "observation.state": torch.rand(4, 2, 2, generator=g) * 40,  # (B, T, D)
        "action": torch.rand(4, 16, 2, generator=g) * 300,  # (B, horizon, A)
        "action_is_pad": torch.zeros(4, 16, dtype=torch.bool),
    }


def test_min_max_maps_range_to_minus_one_one_and_mean_std_per_channel():
    norm = Normalize(FEATURES, MODES, make_stats())
    stats = make_stats()
    out = norm(
        {
            "observation.state": torch.stack(
                [stats["observation.state"]["min"], stats["observation.state"]["max"]]
            ),
            "observation.image": torch.full((1, 3, 4, 5), 0.5),
        }
    )
    torch.testing.assert_close(out["observation.state"], torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    # Channel c: (0.5 - mean_c) / std_c, the same at every pixel.
    expected = ((0.5 - torch.tensor([0.1, 0.5, 0.9])) / torch.tensor([0.2, 0.1, 0.05])).view(1, 3, 1, 1)
    torch.testing.assert_close(out["observation.image"], expected.expand(1, 3, 4, 5), rtol=1e-5, atol=1e-5)


def test_round_trip_with_any_leading_dims_and_untouched_keys():
    norm, unnorm = Normalize(FEATURES, MODES, make_stats()), Unnormalize(FEATURES, MODES, make_stats())
    batch = make_batch()
    normalized = norm(batch)
    assert normalized["action_is_pad"] is batch["action_is_pad"]  # not a feature: passed through
    assert not torch.allclose(normalized["action"], batch["action"])
    restored = unnorm(normalized)
    for key in FEATURES:
        torch.testing.assert_close(restored[key], batch[key], rtol=1e-5, atol=1e-4)
    # The input dict is not modified in place.
    assert set(batch) == set(make_batch())


def test_statistics_live_in_the_state_dict(tmp_path):
    norm = Normalize(FEATURES, MODES, make_stats())
    save_file(norm.state_dict(), tmp_path / "norm.safetensors")
    fresh = Normalize(FEATURES, MODES, stats=None)
    with pytest.raises(RuntimeError, match="statistics not loaded: 'observation.image'"):
        fresh(make_batch())
    fresh.load_state_dict(load_file(tmp_path / "norm.safetensors"))
    batch = make_batch()
    for key, value in norm(batch).items():
        torch.testing.assert_close(fresh(batch)[key], value)


def test_loading_placeholders_again_is_detected():
    """The loaded-check is cached, but a later load resets it."""
    norm = Normalize(FEATURES, MODES, make_stats())
    norm(make_batch())
    norm.load_state_dict(Normalize(FEATURES, MODES, stats=None).state_dict())
    with pytest.raises(RuntimeError, match="statistics not loaded"):
        norm(make_batch())


def test_bounds_fallback_and_missing_statistics():
    with pytest.raises(KeyError, match="no statistics for feature 'action'"):
        Normalize(FEATURES, MODES, {k: v for k, v in make_stats().items() if k != "action"})
    norm = Normalize(
        {k: v for k, v in FEATURES.items() if k != "observation.image"},
        MODES,
        stats=None,
        bounds_fallback=True,
    )
    out = norm({"observation.state": torch.tensor([0.0, 512.0]), "action": torch.tensor([[50.0, 100.0]])})
    torch.testing.assert_close(out["observation.state"], torch.tensor([-1.0, 1.0]))
    # `low: [0.0], high: [100.0]` is one bound for every element.
    torch.testing.assert_close(out["action"], torch.tensor([[0.0, 1.0]]))


def test_identity_mode_and_constant_feature():
    features = {"observation.state": FeatureConfig(shape=[2], kind="state")}
    identity = Normalize(features, {"state": "identity"}, stats=None)
    x = torch.randn(3, 2)
    assert identity({"observation.state": x})["observation.state"] is x
    # A constant element (min == max) must stay finite.
    stats = {"observation.state": {"min": torch.tensor([1.0, 0.0]), "max": torch.tensor([1.0, 2.0])}}
    norm, unnorm = (
        Normalize(features, {"state": "min_max"}, stats),
        Unnormalize(features, {"state": "min_max"}, stats),
    )
    x = torch.tensor([[1.0, 1.0]])
    y = norm({"observation.state": x})["observation.state"]
    torch.testing.assert_close(y, torch.tensor([[-1.0, 0.0]]))
    torch.testing.assert_close(unnorm({"observation.state": y})["observation.state"], x)


def test_bad_statistics_shape_and_mode():
    stats = make_stats()
    stats["observation.state"]["min"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"observation.state'.min has shape \(3,\)"):
        Normalize(FEATURES, MODES, stats)
    with pytest.raises(ValueError, match="normalization mode 'zscore'"):
        Normalize(FEATURES, {"state": "zscore"}, make_stats())
