"""make_env and the sync/async choice."""

import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from omegaconf import OmegaConf

import lerobot.envs.factory as factory
from lerobot.config import env_config, validate_config
from lerobot.envs import make_env, observation_to_batch, resolve_use_async
from lerobot.errors import ConfigError


def load(name: str):
    return env_config(validate_config({"env": OmegaConf.load(f"configs/env/{name}.yaml")}))


@pytest.mark.parametrize("use_async,cls", [(False, SyncVectorEnv), (True, AsyncVectorEnv)])
def test_make_env_kinds_and_time_limit(use_async, cls):
    env = make_env(load("pusht_keypoints"), 2, use_async=use_async)
    try:
        assert isinstance(env, cls) and env.num_envs == 2
        assert env.get_attr("spec")[0].max_episode_steps == 300
        obs, _ = env.reset(seed=0)
        batch = observation_to_batch(obs)
        assert batch["observation.environment_state"].shape == (2, 16)
        assert batch["observation.state"].shape == (2, 2)
    finally:
        env.close()


def test_pendulum_plain_array_observation():
    env = make_env(load("pendulum"), 3)
    obs, _ = env.reset(seed=0)
    assert observation_to_batch(obs)["observation.state"].shape == (3, 3)
    env.close()


def test_bad_env_config_is_named():
    cfg = load("pusht_keypoints")
    with pytest.raises(ConfigError, match="n_envs"):
        make_env(cfg, 0)
    cfg.gym_id = "gym_pusht/Nope-v0"
    with pytest.raises(ConfigError, match="unknown gym id"):
        make_env(cfg, 1)


def test_use_async_auto_is_measured_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    factory.measured_async_choice.cache_clear()
    cfg = load("pusht")
    assert resolve_use_async("true", cfg, 1) is True
    assert resolve_use_async("false", cfg, 8) is False
    assert resolve_use_async("auto", cfg, 1) is False  # one env: nothing to overlap
    calls = []

    def fake_rate(env_cfg, n_envs, use_async, n_steps=40):
        calls.append(use_async)
        return 500.0 if use_async else 300.0

    monkeypatch.setattr(factory, "usable_cores", lambda: 4)
    monkeypatch.setattr(factory, "measure_vector_steps_per_s", fake_rate)
    assert resolve_use_async("auto", cfg, 8) is True
    assert sorted(calls) == [False, True]
    # Cached on disk: a new process (cleared in-process cache) does not measure again.
    factory.measured_async_choice.cache_clear()
    assert resolve_use_async("auto", cfg, 8) is True and len(calls) == 2
    monkeypatch.setattr(
        factory, "measure_vector_steps_per_s", lambda cfg, n, use_async: 100.0 if use_async else 300.0
    )
    assert resolve_use_async("auto", cfg, 4) is False  # another env count is measured on its own
    monkeypatch.setattr(factory, "usable_cores", lambda: 2)
    assert resolve_use_async("auto", cfg, 8) is False  # 2 cores: sync, not measured


def test_measure_vector_steps_per_s_runs():
    assert factory.measure_vector_steps_per_s(load("pusht_keypoints"), 2, use_async=False, n_steps=5) > 0


def test_observation_to_batch_converts_by_layout_into_fresh_memory():
    """Images (B, H, W, C) uint8 -> (B, C, H, W) float32 / 255; vectors -> float32; nothing aliases the input
    (the vector env's buffers are overwritten by the next step while a policy may keep the tensors)."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)
    state32 = rng.random((4, 2), dtype=np.float32)
    state64 = rng.random((4, 7))
    batch = observation_to_batch({"observation.image": image, "a": state32, "b": state64})
    assert (
        batch["observation.image"].shape == (4, 3, 6, 5) and batch["observation.image"].dtype == torch.float32
    )
    torch.testing.assert_close(
        batch["observation.image"], torch.from_numpy(image).permute(0, 3, 1, 2).float() / 255.0
    )
    assert batch["a"].dtype == batch["b"].dtype == torch.float32
    torch.testing.assert_close(batch["a"], torch.from_numpy(state32))
    for tensor, array in ((batch["observation.image"], image), (batch["a"], state32), (batch["b"], state64)):
        assert not np.shares_memory(tensor.numpy(), array)
    state32[:] = -1.0  # the env writes its next observation into the same buffer
    assert batch["a"].min() >= 0.0


def test_observation_keys_map_nested_and_whole_observations():
    pendulum = load("pendulum")
    assert dict(pendulum.observation_keys) == {".": "observation.state"}
    env = make_env(pendulum, 2, copy=False)
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == {"observation.state"} and obs["observation.state"].shape == (2, 3)
        assert list(env.single_observation_space.spaces) == ["observation.state"]
    finally:
        env.close()
    keypoints = load("pusht_keypoints")
    keypoints.observation_keys = {}
    with pytest.raises(ConfigError, match="no env.observation_keys"):
        make_env(keypoints, 1)


def test_env_yaml_must_map_every_observation_feature():
    env = OmegaConf.load("configs/env/pusht.yaml")
    env.observation_keys = {"pixels": "observation.image"}
    with pytest.raises(ConfigError, match="maps nothing to feature 'observation.state'"):
        validate_config({"env": env})
    env.observation_keys = {"pixels": "observation.image", "agent_pos": "observation.velocity"}
    with pytest.raises(ConfigError, match="'observation.velocity' is not an observation feature"):
        validate_config({"env": env})
