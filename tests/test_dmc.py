"""DeepMind Control envs (lerobot/envs/dmc.py, configs/env/dmc_*.yaml) with TD-MPC's protocol, and the
TD-MPC recipe for them (configs/experiment/tdmpc_dmc.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

pytest.importorskip("dm_control", reason="dm_control is not installed: pip install 'lerobot[mujoco]'")

from lerobot.cli import compose_config, train_main  # noqa: E402
from lerobot.cli.compose import compose_train_config  # noqa: E402
from lerobot.config import env_config  # noqa: E402
from lerobot.envs import make_env, make_single_env  # noqa: E402
from lerobot.envs.dmc import CONFIG_GYM_ID, DMCEnv  # noqa: E402
from lerobot.errors import ConfigError  # noqa: E402
from lerobot.policy_registry import make_policy_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from tiny import TINY_PLANNER, TINY_TDMPC  # noqa: E402

# config name -> (suite domain, task, observation size, action size, control timestep in seconds)
TASKS = {
    "dmc_cartpole_swingup": ("cartpole", "swingup", 5, 1, 0.01),
    "dmc_walker_walk": ("walker", "walk", 24, 6, 0.025),
    "dmc_reacher_easy": ("reacher", "easy", 6, 2, 0.02),
    "dmc_finger_spin": ("finger", "spin", 9, 2, 0.02),
    "dmc_cup_catch": ("ball_in_cup", "catch", 8, 2, 0.02),
    "dmc_cheetah_run": ("cheetah", "run", 17, 6, 0.01),
}


def _env_cfg(name: str, *overrides: str):
    return env_config(compose_config(["policy=tdmpc", f"env={name}", *overrides]))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_spaces_shapes_and_protocol(name):
    """Each config: the declared shapes, the spec's action bounds, 500 agent steps at action repeat 2, and
    fps = 1 / (control timestep x 2)."""
    domain, task, obs_dim, action_dim, control_dt = TASKS[name]
    cfg = _env_cfg(name)
    assert cfg.name == name and cfg.max_episode_steps == 500 and cfg.gym_kwargs["action_repeat"] == 2
    assert cfg.gym_id == CONFIG_GYM_ID == "lerobot.envs.dmc:lerobot/DMC-v0"
    assert cfg.features["observation.state"].shape == [obs_dim]
    assert cfg.features["action"].shape == [action_dim]
    assert cfg.fps == round(1 / (2 * control_dt))
    env = make_single_env(cfg)
    try:
        dmc = env.unwrapped
        assert (dmc.domain, dmc.task) == (domain, task) and dmc.control_timestep == control_dt
        assert env.observation_space["observation.state"].shape == (obs_dim,)
        spec = dmc.dm_env.action_spec()
        np.testing.assert_array_equal(env.action_space.low, spec.minimum)
        np.testing.assert_array_equal(env.action_space.high, spec.maximum)
        assert env.action_space.low.tolist() == cfg.features["action"].low * action_dim
        assert env.metadata["render_fps"] == cfg.fps
        obs, info = env.reset(seed=0)
        assert obs["observation.state"].shape == (obs_dim,) and obs["observation.state"].dtype == np.float32
        assert info == {}
    finally:
        env.close()


def test_observation_is_the_spec_dict_flattened_in_order():
    env = DMCEnv("walker", "walk")
    obs, _ = env.reset(seed=3)
    # The task's own observation of the state just reset.
    expected = env.dm_env.task.get_observation(env.dm_env.physics)
    assert [name for name, _ in env.observation_layout] == ["orientations", "height", "velocity"]
    assert [(s.start, s.stop) for _, s in env.observation_layout] == [(0, 14), (14, 15), (15, 24)]
    for name, part in env.observation_layout:
        np.testing.assert_array_equal(obs[part], np.asarray(expected[name], dtype=np.float32).reshape(-1))
    env.close()


def test_one_agent_step_is_two_control_steps_with_their_rewards_summed():
    """Against dm_control itself, from the same seed: the same observation after 2 control steps, and the
    reward of the agent step is the sum of the two control steps' rewards."""
    # Imported after lerobot.envs.dmc, which picks a headless OpenGL backend before dm_control loads one.
    from dm_control import suite

    env = DMCEnv("cartpole", "swingup", action_repeat=2)
    raw = suite.load("cartpole", "swingup", task_kwargs={"random": 7})

    def flat(observation):
        return np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1) for v in observation.values()])

    obs, _ = env.reset(seed=7)
    np.testing.assert_array_equal(obs, flat(raw.reset().observation))
    rng = np.random.default_rng(0)
    for _ in range(5):
        action = rng.uniform(-1, 1, size=1).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        timesteps = [raw.step(action) for _ in range(2)]
        np.testing.assert_array_equal(obs, flat(timesteps[-1].observation))
        assert reward == pytest.approx(sum(t.reward for t in timesteps), abs=1e-12) and reward > 0
        assert not terminated and not truncated
    # 5 agent steps = 10 control steps of 0.01 s.
    assert env.dm_env.physics.data.time == pytest.approx(10 * 0.01)
    assert raw.physics.data.time == pytest.approx(env.dm_env.physics.data.time)
    env.close()


def test_an_episode_is_500_agent_steps_then_truncated():
    env = make_single_env(_env_cfg("dmc_reacher_easy"))
    env.reset(seed=0)
    zero = np.zeros(2, dtype=np.float32)
    ends = []
    for _ in range(500):
        _, _, terminated, truncated, _ = env.step(zero)
        ends.append((terminated, truncated))
    assert ends[:-1] == [(False, False)] * 499 and ends[-1] == (False, True)
    # 1,000 control steps of 0.02 s: the suite's own time limit, reached at the same step.
    assert env.unwrapped.dm_env.physics.data.time == pytest.approx(20.0)
    env.close()


def test_step_after_the_end_raises_instead_of_starting_a_new_episode():
    env = DMCEnv("cartpole", "swingup", action_repeat=500)  # 2 agent steps per episode
    env.reset(seed=0)
    assert env.step(np.zeros(1))[3] is False
    assert env.step(np.zeros(1))[3] is True
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.zeros(1))
    env.close()


def test_seeded_resets_reproduce_their_initial_state_and_episode():
    env = make_single_env(_env_cfg("dmc_cup_catch"))
    actions = np.random.default_rng(0).uniform(-1, 1, size=(20, 2)).astype(np.float32)

    def episode(seed):
        obs, _ = env.reset(seed=seed)
        out = [obs["observation.state"]]
        rewards = []
        for a in actions:
            obs, reward, *_ = env.step(a)
            out.append(obs["observation.state"])
            rewards.append(reward)
        return np.stack(out), np.array(rewards)

    first, rewards_first = episode(11)
    again, rewards_again = episode(11)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(rewards_first, rewards_again)
    other, _ = episode(12)
    assert not np.array_equal(first[0], other[0])
    # Without a seed the task goes on drawing from its random state: not seed 12's initial state again.
    unseeded, _ = env.reset()
    assert not np.array_equal(unseeded["observation.state"], other[0])
    env.close()


def test_bad_task_and_seed_give_one_clear_error():
    with pytest.raises(ConfigError, match="no DeepMind Control task cartpole/walk"):
        DMCEnv("cartpole", "walk")
    with pytest.raises(ConfigError, match="action_repeat=0"):
        DMCEnv("cartpole", "swingup", action_repeat=0)
    env = DMCEnv("cartpole", "swingup")
    with pytest.raises(ValueError, match=r"seeds in \[0, 2\*\*32\)"):
        env.reset(seed=2**32)
    env.close()


def test_render_rgb_array():
    env = DMCEnv("cartpole", "swingup", render_mode="rgb_array", render_size=48)
    env.reset(seed=0)
    try:
        frame = env.render()
    except Exception as e:  # no OpenGL backend on this machine: the envs still work from state
        pytest.skip(f"no headless OpenGL backend: {e}")
    assert frame.shape == (48, 48, 3) and frame.dtype == np.uint8 and frame.std() > 0
    assert DMCEnv("cartpole", "swingup").render() is None
    env.close()


def test_rendering_then_loading_triton_does_not_crash(tmp_path):
    """A process with torch renders a DMC frame (Mesa's LLVM loads), then imports torch._dynamo (triton):
    the order that crashed before lerobot.envs.dmc loaded triton first."""
    code = (
        "import torch\n"
        "from lerobot.envs.dmc import DMCEnv\n"
        "env = DMCEnv('cartpole', 'swingup', render_mode='rgb_array', render_size=16)\n"
        "env.reset(seed=0)\n"
        "env.render()\n"
        "import torch._dynamo\n"
        "torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))]).step()\n"
        "print('survived')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "survived" in result.stdout, result.stderr[-2000:]


def test_vector_envs_sync_and_async_agree_and_workers_stay_torch_free():
    cfg = _env_cfg("dmc_finger_spin")
    actions = np.random.default_rng(1).uniform(-1, 1, size=(6, 2, 2)).astype(np.float32)
    runs = []
    for use_async in (False, True):
        env = make_env(cfg, 2, use_async=use_async, render_mode=None)
        try:
            obs, _ = env.reset(seed=[5, 6])
            trace = [obs["observation.state"].copy()]
            for a in actions:
                obs, reward, terminated, truncated, _ = env.step(a)
                trace += [obs["observation.state"].copy(), reward.copy()]
                assert not terminated.any() and not truncated.any()
            if use_async:
                for process in env.processes:
                    with open(f"/proc/{process.pid}/maps") as f:
                        assert "libtorch" not in f.read()
        finally:
            env.close()
        runs.append(trace)
    assert runs[0][0].shape == (2, 9) and not np.array_equal(runs[0][0][0], runs[0][0][1])
    for sync_part, async_part in zip(*runs):
        np.testing.assert_array_equal(sync_part, async_part)


def test_recipe_holds_the_papers_settings():
    cfg = compose_config(["+experiment=tdmpc_dmc", "env=dmc_walker_walk"])
    policy = make_policy_config(cfg.policy, env_config(cfg))
    assert cfg.env.name == "dmc_walker_walk"
    assert (policy.num_samples, policy.num_elites, policy.num_pi_trajs, policy.iterations) == (512, 64, 25, 6)
    assert (policy.horizon, policy.optimizer_lr, policy.min_std) == (5, 1e-3, 0.05)
    assert (policy.n_q, policy.n_q_min, policy.enc_dim, policy.mlp_dim, policy.discount) == (
        2,
        2,
        256,
        512,
        0.99,
    )
    t = cfg.training
    assert (t.steps, t.batch_size, t.learning_starts) == (100_000, 512, 5000)
    assert (t.n_envs, t.train_freq, t.gradient_steps) == (1, 1, 1)
    assert (cfg.eval.n_episodes, cfg.eval.freq) == (10, 10_000)


def test_tdmpc2_recipe_holds_tdmpc2s_settings_and_the_same_protocol():
    cfg = compose_config(["+experiment=tdmpc2_dmc", "env=dmc_finger_spin"])
    policy = make_policy_config(cfg.policy, env_config(cfg))
    assert (policy.latent_dim, policy.mlp_dim, policy.simnorm_dim, policy.n_q, policy.n_q_min) == (
        512,
        512,
        8,
        5,
        2,
    )
    assert (policy.value_bins, policy.prior_entropy_coeff, policy.horizon, policy.momentum) == (
        101,
        1e-4,
        3,
        0.0,
    )
    assert (policy.consistency_coeff, policy.reward_coeff, policy.value_coeff, policy.rho) == (
        20.0,
        0.1,
        0.02,  # TD-MPC2's 0.1 on the mean over its 5 Qs; here the loss sums over them
        0.5,
    )
    assert (policy.activation, policy.q_dropout, policy.encoder_lr_scale) == ("mish", 0.01, 0.3)
    assert (policy.q_scale_stat, policy.policy_q_reduction) == ("percentile_range", "mean")
    assert (policy.batch_size, policy.optimizer_lr, policy.tau, policy.schedule_steps) == (256, 3e-4, 0.01, 0)
    t = cfg.training
    assert (t.learning_starts, t.initial_updates, t.grad_clip_norm, t.per_alpha) == (2500, 2500, 20.0, 0.0)
    paper = compose_config(["+experiment=tdmpc_dmc", "env=dmc_finger_spin"])
    assert cfg.env == paper.env and cfg.eval == paper.eval and t.steps == paper.training.steps


def test_tiny_tdmpc_run_through_the_training_command(tmp_path):
    """The recipe, shrunk, trains a few dozen steps on cartpole-swingup and evaluates by episode return."""
    run_dir = tmp_path / "run"
    tiny = [
        "+experiment=tdmpc_dmc",
        "env.max_episode_steps=20",
        *TINY_TDMPC,  # n_q=2, as the recipe
        *TINY_PLANNER,
        "training.batch_size=8",
        "training.steps=48",
        "training.learning_starts=24",
        "training.initial_updates=24",
        "policy.schedule_steps=40",
        "training.log_freq=24",
        "training.save_freq=48",
        "eval.freq=48",
        "eval.n_episodes=2",
        "eval.batch_size=2",
        "eval.max_episodes_rendered=0",
        f"output_dir={run_dir}",
    ]
    assert train_main(tiny) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    (evaluation,) = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train] == [24, 48]
    # One update per step past learning_starts, plus the recipe's burst when learning starts (shrunk to 24).
    assert train[-1]["updates"] == 24 + 24 and np.isfinite(train[-1]["loss"])
    # Two 20-step episodes finished by step 40; DMC pays rewards in [0, 1] per control step.
    assert train[-1]["episode_length"] == 20 and 0 <= train[-1]["episode_return"] <= 40
    assert evaluation["step"] == 48 and 0 <= evaluation["avg_sum_reward"] <= 40


@pytest.mark.parametrize(
    "cpu,paper,task",
    [
        ("tdmpc_dmc_cpu", "tdmpc_dmc", "env=dmc_walker_walk"),
        ("tdmpc_metaworld_cpu", "tdmpc_metaworld", "env.task=hammer-v3"),
    ],
)
def test_cpu_recipes_change_the_sizes_and_nothing_else(cpu, paper, task):
    """The CPU-sized recipes keep the paper recipe's protocol and training settings (what makes their figures
    comparable with the published ones); only the model, the planner and the batch shrink."""
    sizes = {"latent_dim", "enc_dim", "mlp_dim", "num_samples", "num_elites", "num_pi_trajs", "iterations"}
    small = OmegaConf.to_container(compose_config([f"+experiment={cpu}", task]))
    full = OmegaConf.to_container(compose_config([f"+experiment={paper}", task]))
    assert {k for k in full["policy"] if small["policy"][k] != full["policy"][k]} == sizes
    assert {k for k in full["training"] if small["training"][k] != full["training"][k]} == {"batch_size"}
    for section in ("env", "eval"):
        assert small[section] == full[section]
    assert small["policy"]["schedule_steps"] == 25000 and small["training"]["initial_updates"] == 5000
    # TD-MPC2's discount for the episode length: 0.99 for DMC's 500 agent steps, 0.95 for MetaWorld's 100.
    length = full["env"]["max_episode_steps"]
    assert small["policy"]["discount"] == min(max((length / 5 - 1) / (length / 5), 0.95), 0.995)


def _pixel_env(**kwargs) -> DMCEnv:
    """A small pixel env, or a skip where this machine has no headless OpenGL backend."""
    env = DMCEnv("cartpole", "swingup", obs_type="pixels", **kwargs)
    try:
        env.reset(seed=0)
    except Exception as e:  # no OpenGL backend: the envs still work from state
        env.close()
        pytest.skip(f"no headless OpenGL backend: {e}")
    return env


def test_pixel_observations_stack_the_latest_frames_oldest_first():
    """From pixels the observation is the last 3 camera frames on the channels: a reset repeats its first frame,
    and each step drops the oldest and appends the new one (what the policy sees of the velocity)."""
    env = _pixel_env(image_size=24, frame_stack=3, action_repeat=4)
    try:
        assert env.observation_space.shape == (24, 24, 9) and env.observation_space.dtype == np.uint8
        first, _ = env.reset(seed=3)
        assert first.shape == (24, 24, 9) and first.dtype == np.uint8
        assert (first[..., 0:3] == first[..., 3:6]).all() and (first[..., 3:6] == first[..., 6:9]).all()
        frames = [first[..., 6:9]]
        obs = first
        for _ in range(3):
            before = obs
            obs, *_ = env.step(np.ones(1, dtype=np.float32))
            np.testing.assert_array_equal(obs[..., 0:6], before[..., 3:9])
            frames.append(obs[..., 6:9])
        assert not (frames[-1] == frames[0]).all()  # the cart moved
        np.testing.assert_array_equal(obs, np.concatenate(frames[-3:], axis=-1))
        again, _ = env.reset(seed=3)
        np.testing.assert_array_equal(again, first)  # a seed gives its frames again
    finally:
        env.close()
    with pytest.raises(ConfigError, match="obs_type='rgb'"):
        DMCEnv("cartpole", "swingup", obs_type="rgb")
    with pytest.raises(ConfigError, match="frame_stack=0"):
        DMCEnv("cartpole", "swingup", obs_type="pixels", frame_stack=0)


@pytest.mark.parametrize(
    "name,action_repeat,action_dim", [("dmc_cartpole_swingup_pixels", 8, 1), ("dmc_cup_catch_pixels", 4, 2)]
)
def test_pixel_configs_hold_drqs_protocol(name, action_repeat, action_dim):
    """DrQ's (PlaNet's) per-task action repeat, 1,000 control steps per episode, 84x84 frames, 3 stacked."""
    cfg = _env_cfg(name, "policy=sac")  # TD-MPC reads state alone
    kwargs = cfg.gym_kwargs
    assert (kwargs["action_repeat"], kwargs["obs_type"], kwargs["image_size"], kwargs["frame_stack"]) == (
        action_repeat,
        "pixels",
        84,
        3,
    )
    assert cfg.max_episode_steps * action_repeat == 1000
    assert cfg.features["observation.image"].shape == [9, 84, 84]
    assert cfg.features["action"].shape == [action_dim]


def test_pixel_recipes_differ_in_the_batch_alone_and_the_cpu_one_is_chosen_on_a_cpu():
    small = OmegaConf.to_container(compose_config(["+experiment=sac_dmc_pixels_cpu"]))
    full = OmegaConf.to_container(compose_config(["+experiment=sac_dmc_pixels"]))
    assert {k for k in full["policy"] if small["policy"][k] != full["policy"][k]} == {"batch_size"}
    assert (small["policy"]["batch_size"], full["policy"]["batch_size"]) == (128, 512)
    for section in ("env", "eval", "training"):
        assert small[section] == full[section]
    # DrQ's 100,000 simulator steps at cartpole's action repeat of 8.
    assert full["training"]["steps"] * full["env"]["gym_kwargs"]["action_repeat"] == 100_000
    auto = compose_train_config(
        ["policy=sac", "env=dmc_cartpole_swingup_pixels", "device=cpu", "recipe=auto"]
    )
    assert auto.recipe_applied == "sac_dmc_pixels_cpu" and auto.policy.batch_size == 128


def test_tiny_sac_run_from_pixels_through_the_training_command(tmp_path):
    """The pixel recipe, shrunk (16x16 frames, a small encoder), trains SAC on cartpole-swingup's stacked frames
    and evaluates by episode return; the replay buffer keeps the frames as uint8."""
    _pixel_env(image_size=8).close()  # skips where nothing renders
    text = (REPO / "configs" / "env" / "dmc_cartpole_swingup_pixels.yaml").read_text()
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "dmc_cartpole_swingup_pixels.yaml").write_text(
        text.replace("image_size: 84", "image_size: 16").replace("[9, 84, 84]", "[9, 16, 16]")
    )
    run_dir = tmp_path / "run"
    tiny = [
        "--config-dir",
        str(tmp_path),
        "+experiment=sac_dmc_pixels_cpu",
        "env.max_episode_steps=10",
        "policy.hidden_dims=[16]",
        "policy.image_encoder_layers=2",
        "policy.image_encoder_channels=4",
        "policy.image_shift_pad=2",
        "training.batch_size=8",
        "training.steps=30",
        "training.learning_starts=20",
        "training.buffer_capacity=40",
        "training.log_freq=30",
        "training.save_freq=30",
        "eval.freq=30",
        "eval.n_episodes=2",
        "eval.batch_size=2",
        f"output_dir={run_dir}",
    ]
    assert train_main(tiny) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (train,) = [r for r in records if r["split"] == "train"]
    (evaluation,) = [r for r in records if r["split"] == "eval"]
    assert train["updates"] == 10 and np.isfinite(train["loss"])
    # Ten agent steps of 8 control steps each, rewards in [0, 1] per control step.
    assert train["episode_length"] == 10 and 0 <= train["episode_return"] <= 80
    assert evaluation["step"] == 30 and 0 <= evaluation["avg_sum_reward"] <= 80
