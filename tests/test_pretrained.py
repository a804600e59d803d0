"""The hub layout (config.json + model.safetensors): save/load round trip, training checkpoints, offline hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lerobot.checkpoints import from_pretrained, read_spec, save_pretrained
from lerobot.checkpoints.hub import CONFIG_JSON, MODEL_FILE
from lerobot.cli import compose_config, eval_main
from lerobot.config import env_config
from lerobot.errors import ConfigError, PretrainedError
from lerobot.policies.diffusion.modeling import DiffusionPolicy
from lerobot.policies.tdmpc.modeling import TDMPCPolicy
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training import offline
from lerobot.training.run_dir import RunDir
from lerobot.training.update import TrainStep

TINY = [
    "policy=diffusion",
    "env=pusht_keypoints",
    "policy.down_dims=[16,32]",
    "policy.diffusion_step_embed_dim=8",
    "policy.n_groups=4",
    "policy.inference_scheduler=DDIM",
    "policy.num_inference_steps=4",
]


def _stats(cfg) -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    stats = {}
    for key, feature in env_config(cfg).features.items():
        low = 10 + 50 * torch.rand(feature.shape, generator=gen)
        stats[key] = {"min": low, "max": low + 300 + 100 * torch.rand(feature.shape, generator=gen)}
    return stats


@pytest.fixture(scope="module")
def trained():
    """A tiny keypoint Diffusion Policy with perturbed weights (norm layers away from 1/0) and its config."""
    cfg = compose_config(TINY)
    torch.manual_seed(0)
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)), dataset_stats=_stats(cfg))
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return policy.eval(), cfg


def _observations(batch_size: int = 3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        "observation.state": 100 + 300 * torch.rand(batch_size, 2, 2, generator=gen),
        "observation.environment_state": 100 + 300 * torch.rand(batch_size, 2, 16, generator=gen),
    }


def _chunk(policy: DiffusionPolicy, seed: int = 7) -> torch.Tensor:
    return policy.predict_action_chunk(_observations(), generator=torch.Generator().manual_seed(seed))


def test_save_then_load_gives_the_same_weights_and_actions(trained, tmp_path):
    policy, cfg = trained
    out = save_pretrained(policy, tmp_path / "model", env_config(cfg))
    assert sorted(p.name for p in out.iterdir()) == [CONFIG_JSON, MODEL_FILE]
    config = json.loads((out / CONFIG_JSON).read_text())
    assert config["type"] == "diffusion" and config["env"]["name"] == "pusht_keypoints"
    assert config["features"]["observation.environment_state"]["shape"] == [16]
    # The normalization statistics travel in the weights file.
    assert "normalize_inputs.stats.observation_state.min" in load_file(out / MODEL_FILE)

    loaded = from_pretrained(out, policy_class=DiffusionPolicy)
    assert not loaded.training
    own, back = policy.state_dict(), loaded.state_dict()
    assert own.keys() == back.keys() and all(torch.equal(own[k], back[k]) for k in own)
    assert loaded.config.num_inference_steps == 4 and loaded.config.inference_scheduler == "DDIM"
    first = _chunk(policy)
    assert torch.equal(first, _chunk(loaded))
    # The generator alone decides the noise: another seed gives another chunk.
    assert not torch.equal(first, _chunk(loaded, seed=8))


def test_a_directory_saved_with_the_inference_settings_in_the_policy_loads(trained, tmp_path):
    """`config.json` written while the inference settings were the policy's (`policy.inference`): they are
    an evaluation's choice now (the run config's `inference`), so the saved policy loads without them."""
    policy, cfg = trained
    out = save_pretrained(policy, tmp_path / "model", env_config(cfg))
    config = json.loads((out / CONFIG_JSON).read_text())
    config["policy"]["inference"] = dict(fast=True, dtype="bfloat16", int8_weights=False, compile=False)
    (out / CONFIG_JSON).write_text(json.dumps(config))
    assert "inference" not in read_spec(out).policy
    assert torch.equal(_chunk(from_pretrained(out)), _chunk(policy))


def test_loading_through_the_base_class_and_a_wrong_subclass(trained, tmp_path):
    policy, _ = trained
    save_pretrained(policy, tmp_path / "model")  # no env recorded
    assert read_spec(tmp_path / "model").env is None
    assert isinstance(from_pretrained(tmp_path / "model"), DiffusionPolicy)
    with pytest.raises(PretrainedError, match="holds a DiffusionPolicy, not a TDMPCPolicy"):
        from_pretrained(tmp_path / "model", policy_class=TDMPCPolicy)


def test_training_checkpoints_are_pretrained_directories(trained, tmp_path):
    """`offline.save` adds config.json: the checkpoint loads with from_pretrained, with the EMA weights."""
    policy, cfg = trained
    update = TrainStep(policy, policy.config, cfg.training, total_updates=1)
    offline.save(RunDir(tmp_path / "run", cfg, resume_from=None), 5, policy, update)
    ckpt = tmp_path / "run" / "checkpoints" / "000000005"
    loaded = from_pretrained(ckpt)
    saved = load_file(ckpt / MODEL_FILE)
    assert all(torch.equal(saved[k], v) for k, v in loaded.state_dict().items())
    assert read_spec(ckpt).env["name"] == "pusht_keypoints"


def test_from_pretrained_takes_a_run_directory_and_validated_overrides(trained, tmp_path):
    """A run directory (its newest checkpoint) and a hub-layout directory load through the one call, with
    config overrides applied and checked like command-line ones."""
    policy, cfg = trained
    update = TrainStep(policy, policy.config, cfg.training, total_updates=1)
    offline.save(RunDir(tmp_path / "run", cfg, resume_from=None), 5, policy, update)
    save_pretrained(policy, tmp_path / "model")
    for path in (tmp_path / "run", tmp_path / "model"):
        loaded = from_pretrained(path, n_action_steps=2)
        assert loaded.n_action_steps == 2 and loaded.config.n_action_steps == 2
        assert torch.equal(_chunk(loaded), _chunk(policy))
    with pytest.raises(PretrainedError, match="n_action_steps"):
        from_pretrained(tmp_path / "model", n_action_steps=0)
    with pytest.raises(ConfigError, match="n_action_steps"):
        from_pretrained(tmp_path / "run", n_action_steps=0)


def test_evaluating_a_saved_directory_uses_its_recorded_env(trained, tmp_path):
    policy, cfg = trained
    save_pretrained(policy, tmp_path / "model", env_config(cfg))
    out = tmp_path / "eval"
    args = ["eval.n_episodes=2", "eval.batch_size=2", "eval.use_async_envs=false"]
    args += ["eval.max_episodes_rendered=0", "env.max_episode_steps=6", "--output-dir", str(out)]
    assert eval_main(["--checkpoint", str(tmp_path / "model"), *args]) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert info["config"]["env"]["name"] == "pusht_keypoints"
    assert [e["n_steps"] for e in info["per_episode"]] == [6, 6]


def _offline_hub(monkeypatch, tmp_path) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_missing_repo_offline_is_one_line_naming_it(monkeypatch, tmp_path, capsys):
    cache = _offline_hub(monkeypatch, tmp_path)
    with pytest.raises(PretrainedError) as error:
        from_pretrained("someone/no-such-policy")
    message = str(error.value)
    assert "\n" not in message and "'someone/no-such-policy'" in message
    assert "HF_HUB_OFFLINE" in message and str(cache) in message


def test_a_cached_repo_loads_offline(trained, monkeypatch, tmp_path):
    """With HF_HUB_OFFLINE=1 a repo id resolves to its snapshot in the hub cache, without any network."""
    policy, cfg = trained
    cache = _offline_hub(monkeypatch, tmp_path)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someone--tiny-policy"
    save_pretrained(policy, repo / "snapshots" / commit, env_config(cfg))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    loaded = from_pretrained("someone/tiny-policy")
    assert torch.equal(_chunk(policy), _chunk(loaded))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / MODEL_FILE).unlink(), "model.safetensors is missing"),
        (lambda d: (d / MODEL_FILE).write_bytes(b"\x00" * 16), "corrupt or truncated"),
        (lambda d: (d / CONFIG_JSON).write_text("{}"), "neither this project's policy config"),
        (lambda d: (d / CONFIG_JSON).write_text("{"), "is not readable JSON"),
    ],
)
def test_broken_directories_fail_with_one_line(trained, tmp_path, mutate, message):
    policy, _ = trained
    save_pretrained(policy, tmp_path / "model")
    mutate(tmp_path / "model")
    with pytest.raises(PretrainedError, match=message) as error:
        from_pretrained(tmp_path / "model")
    assert "\n" not in str(error.value)


def test_a_missing_local_path_is_not_taken_for_a_repo(tmp_path):
    with pytest.raises(PretrainedError, match="does not exist"):
        from_pretrained(str(tmp_path / "outputs" / "nothing"))


def test_a_task_input_the_policy_does_not_take_is_left_out_of_the_feature_check(tmp_path):
    """A single-task policy (e.g. LeRobot's) runs on a multi-task env, which adds a task index it ignores;
    any other difference still stops the evaluation."""
    from lerobot.checkpoints.hub import PretrainedSpec, check_env_features
    from lerobot.config import EnvConfig, FeatureConfig

    state, action = FeatureConfig([4], "state"), FeatureConfig([4], "action")
    features = {"observation.state": state, "action": action}
    spec = PretrainedSpec(tmp_path, "lerobot-0.6-act", {"name": "act"}, features, env=None)
    task = FeatureConfig([], "task")
    env = EnvConfig(
        name="mt", features={"observation.state": state, "observation.task_index": task, "action": action}
    )
    check_env_features(spec, env)
    wider = EnvConfig(
        name="mt", features={"observation.state": FeatureConfig([5], "state"), "action": action}
    )
    with pytest.raises(ConfigError, match="expects features"):
        check_env_features(spec, wider)
