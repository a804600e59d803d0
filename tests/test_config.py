"""One source for every default: YAML files state only choices and real overrides; the validated config
(what checkpoints save) holds every field, the policy section's included."""

import logging
from dataclasses import MISSING, fields

import pytest
from omegaconf import OmegaConf

from lerobot import policy_registry
from lerobot.checkpoints.run import load_config
from lerobot.checkpoints.run_layout import CONFIG_FILE
from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.cli import compose_config
from lerobot.cli.compose import hydra_overrides
from lerobot.config import (
    CONFIG_DIR,
    EnvConfig,
    EvalConfig,
    RootConfig,
    TrainingConfig,
    env_config,
    policy_config,
    validate_config,
)
from lerobot.errors import ConfigError
from lerobot.policy_registry import available_policies, make_policy, make_policy_config, policy_config_class
from lerobot.runtime.checksums import write_checksums
from lerobot.training.run_dir.saving import save_checkpoint

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


@pytest.mark.parametrize("name", ["diffusion", "tdmpc", "random", "pusht_scripted", "act"])
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
    if name in ("random", "pusht_scripted"):
        policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
        ckpt = save_checkpoint(tmp_path, checkpoint_files(0, policy, cfg))
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
    assert set(available_policies()) >= {"diffusion", "tdmpc", "random", "pusht_scripted", "act"}
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


def test_env_config_holds_no_benchmark_defaults():
    """`EnvConfig` names no env: each env YAML states its gym id, fps and episode length, and a config that
    leaves one unset stops with one line naming it."""
    assert all(getattr(EnvConfig(), key) is None for key in ("name", "gym_id", "fps", "max_episode_steps"))
    for path in sorted((CONFIG_DIR / "env").glob("*.yaml")):
        env = env_config(compose_config(["policy=random", f"env={path.stem}"]))
        assert None not in (env.gym_id, env.fps, env.max_episode_steps), path.stem
    pusht = OmegaConf.load(CONFIG_DIR / "env" / "pusht_keypoints.yaml")
    del pusht["gym_id"]
    with pytest.raises(ConfigError) as error:
        validate_config({"env": pusht})
    assert str(error.value).splitlines() == [
        "env.gym_id not set: every env config (configs/env/NAME.yaml) states name, gym_id, fps, max_episode_steps"
    ]


def test_the_former_policy_name_scripted_still_works(tmp_path, caplog):
    """`scripted` is `pusht_scripted` now: on the command line and in a saved checkpoint's config, with one log
    line; the env values a checkpoint saved (resolved, as every saved config holds them) load as they were."""
    policy_registry._say_renamed.cache_clear()
    with caplog.at_level(logging.WARNING, logger="lerobot.policy_registry"):
        cfg = compose_config(["policy=scripted", "env=pusht_keypoints"])
        sweep = hydra_overrides(["+policy=scripted,random", "policy.seed=1"], [])
    assert sweep == ["+policy=pusht_scripted,random", "policy.seed=1"]
    assert cfg.policy.name == "pusht_scripted" and type(policy_config(cfg)).__name__ == "ScriptedConfig"
    assert [r.getMessage() for r in caplog.records] == [
        "policy=scripted is now policy=pusht_scripted; the old name still works"
    ]
    ckpt = save_checkpoint(tmp_path, checkpoint_files(0, make_policy(policy_config(cfg)), cfg))
    saved = OmegaConf.load(ckpt / CONFIG_FILE)
    assert (saved.env.gym_id, saved.env.fps, saved.env.max_episode_steps) == ("gym_pusht/PushT-v0", 10, 300)
    saved.policy.name = "scripted"  # as a checkpoint saved before the rename holds it
    OmegaConf.save(saved, ckpt / CONFIG_FILE)
    write_checksums(ckpt)
    assert load_config(ckpt) == cfg
