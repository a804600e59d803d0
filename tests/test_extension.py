"""The extension points, shown with new files only: a new env (one YAML under tests/configs, a gymnasium
env with a nested `pixels` dict) and a new policy (one `register_policy` call), evaluated end to end."""

import json

import nested_pixels_env
import pytest
import tiny_policy
import torch
from conftest import REPO_ROOT
from omegaconf import OmegaConf

from lerobot.accel import accelerated
from lerobot.cli import compose_config, eval_main
from lerobot.config import env_config, validate_config
from lerobot.envs import make_env
from lerobot.errors import ConfigError
from lerobot.evaluation import evaluate
from lerobot.policy_registry import make_policy, make_policy_config, register_policy

register_policy("tiny", config="tiny_policy:TinyConfig", policy="tiny_policy:TinyPolicy")

CONFIGS = REPO_ROOT / "tests" / "configs"


def _expected(n_episodes: int, start_seed: int) -> list[tuple[int, int, float, bool]]:
    """(seed, n_steps, sum_reward, success) of each episode when every action earns its reward."""
    rows = []
    for seed in range(start_seed, start_seed + n_episodes):
        steps = nested_pixels_env.term_at(seed)
        rows.append((seed, steps, float(steps), True))
    return rows


@pytest.mark.parametrize("use_async", ["false", "true"])
def test_new_env_and_policy_through_the_eval_script(tmp_path, use_async):
    argv = ["--config-dir", str(CONFIGS), "--output-dir", str(tmp_path)]
    overrides = ["policy=tiny", "env=nested_pixels", "eval.n_episodes=7", "eval.batch_size=3"]
    overrides += [f"eval.use_async_envs={use_async}", "eval.max_episodes_rendered=1", "eval.start_seed=4"]
    assert eval_main(argv + overrides) == 0
    info = json.loads((tmp_path / "eval_info.json").read_text())
    got = [(e["seed"], e["n_steps"], e["sum_reward"], e["success"]) for e in info["per_episode"]]
    assert got == _expected(7, 4)
    assert info["aggregated"]["pc_success"] == 100.0
    assert info["config"]["policy"] == {**info["config"]["policy"], "name": "tiny", "n_action_steps": 2}
    assert len(info["video_paths"]) == 1


def test_policy_sees_batch_keys_shapes_and_scaling(tmp_path):
    cfg = compose_config(
        ["policy=tiny", "env=nested_pixels", "policy.gain=1.0", "eval.n_episodes=4", "eval.batch_size=2"]
        + ["eval.use_async_envs=false", "eval.max_episodes_rendered=0"],
        search_path=[CONFIGS],
    )
    assert set(cfg.policy) >= {"name", "n_obs_steps", "n_action_steps", "gain", "optimizer_lr"}
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    info = evaluate(cfg, policy, tmp_path)
    assert [e["sum_reward"] for e in info["per_episode"]] == [r[2] for r in _expected(4, 100_000)]
    # Every chunk: the newest two observations of the envs that needed one, images channels-first.
    for shapes in policy.seen:
        batch_size = shapes["observation.state"][0]
        assert shapes == {
            "observation.images.top": (batch_size, 2, 3, 12, 16),
            "observation.state": (batch_size, 2, 2),
        }
    # The policy trains like any other: forward gives a differentiable loss.
    batch = {
        "observation.images.top": torch.rand(3, 2, 3, 12, 16),
        "observation.state": torch.rand(3, 2, 2),
        "action": torch.rand(3, 2, 2),
    }
    policy.forward(batch)["loss"].backward()
    assert policy.gain.grad is not None


def test_inference_layer_comes_from_the_registration(tmp_path):
    cfg = compose_config(["policy=tiny", "env=nested_pixels"], search_path=[CONFIGS])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    with accelerated(policy, cfg.inference):  # registered without `inference`: a no-op
        pass
    register_policy(
        "tiny_ctx",
        config="tiny_policy:TinyConfig",
        policy="tiny_policy:TinyPolicy",
        inference="tiny_policy:recording_context",
    )
    section = {**cfg.policy, "name": "tiny_ctx"}
    policy = make_policy(make_policy_config(section, env_config(cfg)))
    with accelerated(policy, cfg.inference):
        assert tiny_policy.ENTERED[-1] == "tiny_ctx"
    # Evaluation runs inside the registered layer.
    n_entered = len(tiny_policy.ENTERED)
    cfg.eval.n_episodes, cfg.eval.batch_size, cfg.eval.max_episodes_rendered = 2, 2, 0
    cfg.eval.use_async_envs = "false"
    evaluate(cfg, policy, tmp_path)
    assert tiny_policy.ENTERED[n_entered:] == ["tiny_ctx"]
    with pytest.raises(ValueError, match="already registered"):
        register_policy("tiny", config="tiny_policy:TinyConfig", policy="tiny_policy:Other")


def test_bad_mapping_or_shape_is_one_clear_error():
    cfg = compose_config(["policy=tiny", "env=nested_pixels"], search_path=[CONFIGS])
    wrong_path = env_config(cfg)
    wrong_path.observation_keys = {"pixels/side": "observation.images.top", "state": "observation.state"}
    with pytest.raises(
        ConfigError,
        match=r"no observation 'pixels/side'; its observation paths are \['pixels/top', 'state'\]",
    ):
        make_env(wrong_path, 1)
    wrong_shape = env_config(cfg)
    wrong_shape.features["observation.images.top"].shape = [3, 16, 12]
    with pytest.raises(
        ConfigError, match=r"shape=\[3, 16, 12\] but the env's observation 'pixels/top' gives \[12, 16, 3\]"
    ):
        make_env(wrong_shape, 1)
    unmapped = OmegaConf.to_container(cfg)
    unmapped["env"]["observation_keys"] = {"state": "observation.state"}
    with pytest.raises(ConfigError, match="maps nothing to feature 'observation.images.top'"):
        validate_config(unmapped)
