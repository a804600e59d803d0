"""Baseline policies: the random policy's bounds, determinism and loaded bounds; the envs each one fits."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lerobot.cli import compose_config
from lerobot.config import CONFIG_DIR, env_config, validate_config
from lerobot.constants import OBS_STATE
from lerobot.envs import make_env
from lerobot.errors import ConfigError
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.rollout import eval_policy


@pytest.fixture
def random_policy():
    cfg = validate_config({"env": OmegaConf.load(CONFIG_DIR / "env" / "pusht_keypoints.yaml")})
    return make_policy(make_policy_config({"name": "random"}, env_config(cfg)))


def _chunks(policy, n_chunks: int, batch_size: int = 3) -> list[np.ndarray]:
    batch = {OBS_STATE: torch.zeros(batch_size, 1, 2)}
    return [policy.predict_action_chunk(batch).numpy() for _ in range(n_chunks)]


def test_random_actions_in_bounds_and_repeatable(random_policy):
    first = _chunks(random_policy, 4)
    assert first[0].shape == (3, random_policy.n_action_steps, 2) and first[0].dtype == np.float32
    actions = np.concatenate(first)
    assert actions.min() >= 0.0 and actions.max() <= 512.0
    assert actions.std() > 100  # spread over the range, not a constant
    random_policy.reset()  # a full reset replays the same sequence
    np.testing.assert_array_equal(np.concatenate(_chunks(random_policy, 4)), actions)


def test_random_policy_reads_loaded_bounds_at_reset(random_policy):
    state = random_policy.state_dict()
    state["low"] = torch.tensor([100.0, 200.0])
    state["high"] = torch.tensor([101.0, 201.0])
    random_policy.load_state_dict(state)
    random_policy.reset()
    actions = np.concatenate(_chunks(random_policy, 2))
    assert actions[..., 0].min() >= 100.0 and actions[..., 0].max() <= 101.0
    assert actions[..., 1].min() >= 200.0 and actions[..., 1].max() <= 201.0


def test_random_policy_evaluations_do_not_depend_on_the_layout(random_policy):
    """With episode streams each episode draws its own actions: 1 env and 3 envs (refill, or fixed
    batches) give the same episodes, exactly."""
    env_cfg = _env("pusht_keypoints")
    env_cfg.max_episode_steps = 30
    results = []
    for num_envs, schedule in ((1, "refill"), (3, "refill"), (3, "batch")):
        env = make_env(env_cfg, num_envs)
        try:
            results.append(
                eval_policy(env, random_policy, 4, start_seed=7, progress=False, schedule=schedule)
            )
        finally:
            env.close()
    # Rewards to 1e-12: gym-pusht's last bit depends on what ran before in the process (test_rollout).
    want = results[0]["per_episode"]
    for got in (r["per_episode"] for r in results[1:]):
        assert [(e["seed"], e["n_steps"], e["success"]) for e in got] == [
            (e["seed"], e["n_steps"], e["success"]) for e in want
        ]
        for key in ("sum_reward", "max_reward"):
            assert [e[key] for e in got] == pytest.approx([e[key] for e in want], rel=1e-12, abs=1e-12)
    assert len({e["max_reward"] for e in want}) > 1  # episodes that differ


def _env(name: str):
    return env_config(validate_config({"env": OmegaConf.load(CONFIG_DIR / "env" / f"{name}.yaml")}))


def test_baselines_declare_the_envs_they_fit():
    """pusht_scripted: a bounded 2-D action, the agent's position and keypoints or an image; random: any
    bounded action."""
    for env in ("pusht", "pusht_keypoints"):
        make_policy_config({"name": "pusht_scripted"}, _env(env))
    with pytest.raises(ConfigError, match=r"policy=pusht_scripted fits .*action 'action' has shape \[1\]"):
        make_policy_config({"name": "pusht_scripted"}, _env("pendulum"))
    with pytest.raises(ConfigError, match="policy=pusht_scripted"):
        # at config validation, before any env exists
        compose_config(["policy=pusht_scripted", "env=pendulum"])
    policy = make_policy(make_policy_config({"name": "random"}, _env("pendulum")))
    assert policy.predict_action_chunk({OBS_STATE: torch.zeros(2, 1, 3)}).shape == (2, 8, 1)
    unbounded = _env("pendulum")
    unbounded.features["action"].low = None
    with pytest.raises(
        ConfigError, match="policy=random fits any env with a bounded action, but .* no low/high"
    ):
        make_policy_config({"name": "random"}, unbounded)
