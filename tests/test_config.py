"""One source for every default: YAML files state only choices and real overrides; the validated config
(what checkpoints save) holds every field, the policy section's included."""

from dataclasses import MISSING, fields

import pytest
from omegaconf import OmegaConf

from lerobot.checkpoints.run import CONFIG_FILE, load_config, save_checkpoint
from lerobot.cli import compose_config
from lerobot.config import (
    CONFIG_DIR,
    EnvConfig,
    EvalConfig,
    RootConfig,
    TrainingConfig,
    env_config,
    policy_config,
)
from lerobot.errors import ConfigError
from lerobot.policy_registry import available_policies, make_policy, make_policy_config, policy_config_class

FEATURE_FIELDS = {"input_features", "output_features"}


def _defaults(cls) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cls))


def _restated(section: dict, cls, allowed: frozenset = frozenset()) -> list[str]:
    """Keys of `section` whose value equals the dataclass default (a second source of that default)."""
    defaults = _defaults(cls)
    return [k for k, v in section.items() if k not in allowed and k in defaults and defaults[k] == v]


def test_default_yaml_holds_only_the_defaults_list_and_hydra_settings():
    assert list(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "default.yaml"))) == ["defaults", "hydra"]


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "env").glob("*.yaml")), ids=lambda p: p.stem)
def test_env_yaml_restates_no_default(path):
    env = OmegaConf.to_container(OmegaConf.load(path))
    assert env["name"] == path.stem
    assert _restated(env, EnvConfig, frozenset({"name"})) == []


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "experiment").glob("*.yaml")), ids=lambda p: p.stem)
def test_experiment_yaml_restates_no_default(path):
    exp = OmegaConf.to_container(OmegaConf.load(path))
    (policy,) = [
        d["override /policy"] for d in exp["defaults"] if isinstance(d, dict) and "override /policy" in d
    ]
    assert _restated(exp.get("policy", {}), policy_config_class(policy)) == []
    assert _restated(exp.get("training", {}), TrainingConfig) == []
    assert _restated(exp.get("eval", {}), EvalConfig) == []
    top = {k: v for k, v in exp.items() if not isinstance(v, dict | list)}
    assert _restated(top, RootConfig) == []


@pytest.mark.parametrize("name", ["diffusion", "tdmpc", "random", "scripted", "act"])
def test_composed_and_saved_config_hold_every_field(name, tmp_path):
    env = "pendulum" if name == "tdmpc" else "pusht_keypoints"
    cfg = compose_config([f"policy={name}", f"env={env}"])
    want = {f.name for f in fields(policy_config_class(name))}
    # Typed by the policy's dataclass, with the env's features attached.
    assert OmegaConf.get_type(cfg.policy) is policy_config_class(name) and set(cfg.policy) == want
    features = env_config(cfg)
    assert cfg.policy.input_features == features.input_features()
    assert cfg.policy.output_features == features.output_features()
    # Fields left None by the dataclass for `validate()` to resolve are saved resolved.
    if name == "diffusion":
        assert cfg.policy.down_dims == [256, 512, 1024] and cfg.policy.batch_size == 256
    for section, cls in (("training", TrainingConfig), ("eval", EvalConfig)):
        assert set(cfg[section]) == {f.name for f in fields(cls)}
    if name in ("random", "scripted"):
        policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
        ckpt = save_checkpoint(tmp_path, 0, policy, cfg)
        saved = OmegaConf.load(ckpt / CONFIG_FILE)
        assert set(saved.policy) == want and saved.eval.schedule == "refill_aligned"
        assert load_config(ckpt) == cfg


def test_policy_section_is_typed_and_read_once_validated():
    cfg = compose_config(
        ["policy=act", "env=pusht_keypoints", "policy.chunk_size=12", "policy.n_action_steps=12"]
    )
    policy_cfg = policy_config(cfg)
    assert type(policy_cfg) is policy_config_class("act") and policy_cfg.chunk_size == 12
    assert policy_cfg == make_policy_config(cfg.policy, env_config(cfg))  # what validation built, unchanged
    with pytest.raises(Exception, match="chunk_size"):  # the node keeps its dataclass's types
        cfg.policy.chunk_size = "twelve"
    plain = OmegaConf.create({**OmegaConf.to_container(cfg), "policy": {"name": "act"}})
    with pytest.raises(ConfigError, match="not validated"):
        policy_config(plain)


def test_every_registered_policy_composes_without_a_yaml():
    assert not list((CONFIG_DIR / "policy").glob("*.yaml"))
    assert set(available_policies()) >= {"diffusion", "tdmpc", "random", "scripted", "act"}
    cfg = compose_config(["policy=tdmpc", "env=pendulum", "policy.num_samples=64"])
    assert cfg.policy.num_samples == 64 and cfg.policy.name == "tdmpc"
    assert all(f.default is not MISSING or f.default_factory is not MISSING for f in fields(RootConfig))


def test_policy_variant_yaml_in_a_config_dir(tmp_path):
    """A policy YAML is a named variant of a registered policy; it cannot shadow the registered name."""
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "diffusion_small.yaml").write_text("name: diffusion\ndown_dims: [16, 32]\n")
    cfg = compose_config(["policy=diffusion_small", "env=pusht_keypoints"], search_path=[tmp_path])
    assert cfg.policy.name == "diffusion" and list(cfg.policy.down_dims) == [16, 32]
    assert cfg.policy.horizon == 16  # the rest from the dataclass
    (tmp_path / "policy" / "diffusion.yaml").write_text("name: diffusion\n")
    with pytest.raises(ConfigError, match="registered policy 'diffusion'"):
        compose_config(["policy=diffusion", "env=pusht_keypoints"], search_path=[tmp_path])
