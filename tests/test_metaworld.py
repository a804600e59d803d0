"""MetaWorld: the env family, exact multi-task evaluation over env slots, the scripted experts, recording
their episodes as a LeRobotDataset with each episode's task, and a task-conditioned policy learning from it.

Runs on a CPU without a display (MuJoCo renders offscreen through EGL or OSMesa)."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("metaworld", reason="MetaWorld envs need the [mujoco] extra (metaworld==3.1.1)")

from omegaconf import OmegaConf  # noqa: E402

from lerobot.cli import compose_config  # noqa: E402
from lerobot.config import CONFIG_DIR, env_config, policy_config, validate_config  # noqa: E402
from lerobot.envs import make_env  # noqa: E402
from lerobot.envs.factory import env_task_names, make_single_env  # noqa: E402
from lerobot.envs.metaworld import ALL_TASKS, MetaWorldEnv, task_names  # noqa: E402
from lerobot.envs.tasks import episode_plan, split_task_seed, task_seed  # noqa: E402
from lerobot.errors import ConfigError  # noqa: E402
from lerobot.evaluation import per_task_table  # noqa: E402
from lerobot.policy_registry import make_policy, make_policy_config  # noqa: E402
from lerobot.rollout import eval_policy  # noqa: E402

TWO_TASKS = ["reach-v3", "drawer-close-v3"]


def _env_cfg(name: str = "metaworld", **fields):
    env = OmegaConf.load(CONFIG_DIR / "env" / f"{name}.yaml")
    for key, value in fields.items():
        OmegaConf.update(env, key, value, merge=False)
    return env_config(validate_config({"env": env}))


def _policy(name: str, env_cfg):
    return make_policy(make_policy_config({"name": name}, env_cfg))


def test_task_names_resolve_sets_lists_and_reject_unknown_names():
    assert len(task_names("mt10")) == 10 and task_names("mt10")[0] == "reach-v3"
    assert task_names("mt50") == ALL_TASKS and len(ALL_TASKS) == 50
    assert task_names(["reach-v3", "mt10"])[:2] == ["reach-v3", "push-v3"]  # no repeats, first order kept
    groups = [task_names(g) for g in ("easy", "medium", "hard", "very_hard")]
    assert sum(map(len, groups)) == 50 and sorted(sum(groups, [])) == ALL_TASKS
    with pytest.raises(ConfigError, match="unknown MetaWorld task or set 'pick-plac-v3'"):
        task_names("pick-plac-v3")
    assert env_task_names(_env_cfg(task=TWO_TASKS)) == TWO_TASKS
    assert env_task_names(_env_cfg("pusht_keypoints")) is None


def test_task_seed_round_trips_and_single_task_seeds_are_unchanged():
    assert task_seed(0, 123) == 123
    assert split_task_seed(task_seed(7, 99)) == (7, 99)
    plan = episode_plan(2, 10, ["a", "b"])
    assert [(s.task, s.position, s.seed) for s in plan] == [
        ("a", 0, 10),
        ("a", 0, 11),
        ("b", 1, 10),
        ("b", 1, 11),
    ]
    assert [s.reset_seed for s in episode_plan(3, 5)] == [5, 6, 7]


def test_env_observations_fit_their_spaces_and_a_seed_reproduces_task_goal_and_start():
    env = MetaWorldEnv(task=TWO_TASKS)
    try:
        first, info = env.reset(seed=task_seed(1, 42))
        assert info["task"] == "drawer-close-v3" and env.task == "drawer-close-v3"
        assert int(first["task_index"]) == ALL_TASKS.index("drawer-close-v3")
        assert env.observation_space.contains(first)
        assert np.any(first["state"][-3:] != 0)  # the goal is observable
        np.testing.assert_array_equal(first["agent_pos"], first["state"][:4])
        obs, reward, terminated, truncated, info = env.step(np.zeros(4, dtype=np.float32))
        assert env.observation_space.contains(obs) and isinstance(info["is_success"], bool)
        other, _ = env.reset(seed=task_seed(1, 43))
        assert not np.allclose(other["state"][-3:], first["state"][-3:])  # another episode, another goal
        again, _ = env.reset(seed=task_seed(1, 42))
        np.testing.assert_array_equal(again["state"], first["state"])
        reach, _ = env.reset(seed=task_seed(0, 42))
        assert env.task == "reach-v3" and int(reach["task_index"]) == ALL_TASKS.index("reach-v3")
        with pytest.raises(ValueError, match="names task 2 of a task set of 2"):
            env.reset(seed=task_seed(2, 0))
    finally:
        env.close()


def test_pixels_come_right_side_up_and_fast_rendering_is_the_default():
    env = MetaWorldEnv(task="reach-v3", obs_type="pixels_agent_pos", width=64, height=64)
    try:
        obs, _ = env.reset(seed=0)
        assert obs["pixels"].shape == (64, 64, 3) and obs["pixels"].dtype == np.uint8
        raw = env._env.render()
        np.testing.assert_array_equal(obs["pixels"], raw[::-1, ::-1])  # corner2 renders rotated by 180
        assert env._env.model.vis.quality.offsamples == 0 and not env._env.model.light_castshadow.any()
        # The table fills the lower half of a right-side-up image: it is brighter than the sky above it.
        assert obs["pixels"][40:].mean() != obs["pixels"][:24].mean()
    finally:
        env.close()
    full = MetaWorldEnv(task="reach-v3", obs_type="pixels_agent_pos", width=64, height=64, fast_render=False)
    try:
        full.reset(seed=0)
        assert full._env.model.vis.quality.offsamples > 0
    finally:
        full.close()


def test_envs_of_one_process_each_render_their_own_frames():
    # Two tasks side by side in one process (a sync vector env's slots): each env's camera frame is the one
    # a lone env of its task renders, at reset and after steps (each renders in its own OpenGL context).
    def frames(tasks: list[str]) -> list[list[np.ndarray]]:
        envs = [MetaWorldEnv(task=t, obs_type="pixels_agent_pos", width=32, height=32) for t in tasks]
        try:
            out = [[env.reset(seed=i)[0]["pixels"]] for i, env in enumerate(envs)]
            for _ in range(2):
                for i, env in enumerate(envs):
                    out[i].append(env.step(np.zeros(4, dtype=np.float32))[0]["pixels"])
            return out
        finally:
            for env in envs:
                env.close()

    lone = frames(TWO_TASKS[:1])[0]
    side_by_side = frames(TWO_TASKS)[0]
    for k, (a, b) in enumerate(zip(lone, side_by_side)):
        np.testing.assert_array_equal(a, b, err_msg=f"frame {k} of reach-v3 beside another env")


def _rows(result):
    return [
        (r["task"], r["seed"], r["n_steps"], r["success"], round(r["sum_reward"], 6))
        for r in result["per_episode"]
    ]


@pytest.mark.parametrize("policy_name", ["metaworld_expert", "random"])
def test_multi_task_evaluation_is_the_same_whatever_the_slots_schedule_and_vector_env(policy_name):
    """Per-episode results keyed by (task, episode): 1 slot, 3 slots refilled, 3 async slots in fixed
    batches all give the same episodes; the random policy draws from each episode's own stream."""
    env_cfg = _env_cfg(task=TWO_TASKS, max_episode_steps=120)
    policy = _policy(policy_name, env_cfg)
    plan = episode_plan(3, 100, TWO_TASKS)
    results = []
    for num_envs, use_async, schedule in (
        (1, False, "refill"),
        (3, False, "refill_aligned"),
        (3, True, "batch"),
    ):
        env = make_env(env_cfg, num_envs, use_async=use_async)
        try:
            results.append(eval_policy(env, policy, len(plan), plan=plan, progress=False, schedule=schedule))
        finally:
            env.close()
    assert [r["task"] for r in results[0]["per_episode"]] == ["reach-v3"] * 3 + ["drawer-close-v3"] * 3
    for result in results[1:]:
        assert _rows(result) == _rows(results[0])
    per_task = results[0]["aggregated"]["per_task"]
    assert list(per_task) == TWO_TASKS and all(f["n_episodes"] == 3 for f in per_task.values())
    if policy_name == "metaworld_expert":
        assert all(
            r["success"] for r in results[0]["per_episode"]
        )  # these two experts solve within 120 steps


def test_many_tasks_on_few_slots_hold_one_model_per_slot(monkeypatch):
    """All 50 tasks on 2 slots: every task runs, and a slot builds a task's model only when its task
    changes (never one per task at once)."""
    built = []
    original = MetaWorldEnv._use_task

    def counting(self, name):
        if name != self._task:
            built.append(name)
        original(self, name)

    monkeypatch.setattr(MetaWorldEnv, "_use_task", counting)
    env_cfg = _env_cfg(task="mt50", max_episode_steps=3)
    plan = episode_plan(2, 0, env_task_names(env_cfg))
    env = make_env(env_cfg, 2)
    try:
        assert all(sub.unwrapped.task is None for sub in env.envs)  # no model before the first reset
        result = eval_policy(env, _policy("random", env_cfg), len(plan), plan=plan, progress=False)
        assert [sub.unwrapped.task for sub in env.envs].count(None) == 0
    finally:
        env.close()
    per_task = result["aggregated"]["per_task"]
    assert list(per_task) == task_names("mt50") and len(per_task) == 50
    assert all(f["n_episodes"] == 2 and f["avg_steps"] == 3 for f in per_task.values())
    # Two slots walk the tasks in plan order: about one model build per task and slot, not per episode.
    assert len(built) <= 2 * 50 + 2
    table = per_task_table(result["aggregated"])
    assert table.splitlines()[0].startswith("task") and "mean over tasks" in table.splitlines()[-1]
    assert len(table.splitlines()) == 52


def test_expert_episodes_record_as_a_lerobot_dataset_with_their_tasks_and_train_a_task_conditioned_policy(
    tmp_path,
):
    """scripts/eval.py with the expert records MT-style demonstrations (LeRobot's task table, per-frame
    task_index); a Diffusion Policy reads them back and trains, conditioned on the task."""
    import pyarrow.parquet as pq

    from lerobot.cli.eval import eval_main
    from lerobot.cli.train import train_main

    record = tmp_path / "demos"
    code = eval_main(
        [
            "policy=metaworld_expert",
            "env=metaworld",
            f"env.task=[{','.join(TWO_TASKS)}]",
            "eval.n_episodes=2",
            "eval.batch_size=2",
            "eval.use_async_envs=false",
            "eval.max_episodes_rendered=0",
            "eval.start_seed=0",
            f"eval.record_dataset={record}",
            "--output-dir",
            str(tmp_path / "expert_eval"),
        ]
    )
    assert code == 0
    info = json.loads((tmp_path / "expert_eval" / "eval_info.json").read_text())
    assert list(info["aggregated"]["per_task"]) == TWO_TASKS
    assert [r["task"] for r in info["per_episode"]] == [
        "reach-v3",
        "reach-v3",
        "drawer-close-v3",
        "drawer-close-v3",
    ]
    assert pq.read_table(record / "meta" / "tasks.parquet").column("task").to_pylist() == TWO_TASKS
    episodes = pq.read_table(record / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert [t[0] for t in episodes.column("tasks").to_pylist()] == [
        *["reach-v3"] * 2,
        *["drawer-close-v3"] * 2,
    ]
    data = pq.read_table(record / "data" / "chunk-000" / "file-000.parquet")
    lengths = episodes.column("length").to_pylist()
    assert data.column("task_index").to_pylist() == np.repeat([0, 0, 1, 1], lengths).tolist()
    assert set(data.column("observation.task_index").to_pylist()) == {ALL_TASKS.index(t) for t in TWO_TASKS}

    run = tmp_path / "run"
    code = train_main(
        [
            "+experiment=diffusion_metaworld_mt10_cpu",
            f"env.task=[{','.join(TWO_TASKS)}]",
            f"dataset.root={record}",
            "policy.down_dims=[16,32]",
            "training.steps=4",
            "training.batch_size=8",
            "training.save_freq=4",
            "eval.freq=0",
            f"output_dir={run}",
        ]
    )
    assert code == 0
    from lerobot.checkpoints import load_policy

    policy = load_policy(run)
    assert policy.task_embedding.num_embeddings == 50
    # The task changes the conditioning, all else equal.
    batch = {
        "observation.state": torch.zeros(2, 2, 4),
        "observation.environment_state": torch.zeros(2, 2, 39),
        "observation.task_index": torch.tensor([[40.0, 40.0], [17.0, 17.0]]),
    }
    cond = policy.global_conditioning(policy.normalize_inputs(batch))
    assert cond.shape == (2, 2 * (4 + 39) + policy.config.task_embedding_dim)
    assert not torch.equal(cond[0], cond[1])


def test_a_task_input_needs_a_scalar_feature_with_its_highest_id():
    cfg = compose_config(["policy=diffusion", "env=metaworld"])
    assert policy_config(cfg).task_feature == ("observation.task_index", 50)
    env = OmegaConf.load(CONFIG_DIR / "env" / "metaworld.yaml")
    env.features["observation.task_index"].shape = [2]
    policy_cfg = make_policy_config({"name": "diffusion"}, env_config(validate_config({"env": env})))
    with pytest.raises(ConfigError, match="one scalar 'task' input"):
        _ = policy_cfg.task_feature


def test_single_env_of_the_family_builds_from_its_config():
    env = make_single_env(_env_cfg(task="pick-place-v3"))
    try:
        obs, _ = env.reset(seed=task_seed(0, 5))
        assert set(obs) == {"observation.environment_state", "observation.state", "observation.task_index"}
        assert obs["observation.environment_state"].shape == (39,)
    finally:
        env.close()


def test_act_reads_the_task_as_one_more_encoder_token():
    cfg = compose_config(
        ["+experiment=act_metaworld_mt10_cpu", "policy.dim_model=16", "policy.dim_feedforward=32"]
    )
    stats = {
        key: {
            "mean": torch.zeros(dim),
            "std": torch.ones(dim),
            "min": -torch.ones(dim),
            "max": torch.ones(dim),
        }
        for key, dim in (("observation.state", 4), ("observation.environment_state", 39), ("action", 4))
    }
    policy = make_policy(policy_config(cfg), stats)
    assert policy.model.encoder_task_embed.num_embeddings == 50
    assert policy.model.encoder_1d_feature_pos_embed.num_embeddings == 4  # latent, state, env_state, task
    policy.eval()
    batch = {
        "observation.state": torch.zeros(2, 1, 4),
        "observation.environment_state": torch.zeros(2, 1, 39),
        "observation.task_index": torch.tensor([[40.0], [17.0]]),
    }
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (2, 20, 4)
    assert not torch.allclose(chunk[0], chunk[1])  # same observation, another task: another chunk


def test_pixel_demonstrations_record_with_the_expert_and_train_a_pixel_policy_without_the_state(tmp_path):
    """env=metaworld_pixels_expert gives the expert its state and records the camera; a policy trained on
    the recording with env=metaworld_pixels reads the image, agent state and task only."""
    from lerobot.cli.eval import eval_main
    from lerobot.cli.train import train_main

    record = tmp_path / "pixels"
    common = ["eval.batch_size=1", "eval.use_async_envs=false", "env.max_episode_steps=20"]
    code = eval_main(
        [
            "policy=metaworld_expert",
            "env=metaworld_pixels_expert",
            "env.task=reach-v3",
            "eval.n_episodes=1",
            "eval.max_episodes_rendered=0",
            f"eval.record_dataset={record}",
            *common,
            "--output-dir",
            str(tmp_path / "eval"),
        ]
    )
    assert code == 0
    features = json.loads((record / "meta" / "info.json").read_text())["features"]
    assert features["observation.image"]["shape"][-3:] in ([96, 96, 3], [3, 96, 96])
    assert "observation.environment_state" in features
    run = tmp_path / "run"
    code = train_main(
        [
            "+experiment=diffusion_metaworld_mt10_image_cpu",
            "env.task=reach-v3",
            f"dataset.root={record}",
            "policy.down_dims=[16,32]",
            "training.steps=2",
            "training.batch_size=4",
            "eval.freq=0",
            "training.save_freq=2",
            f"output_dir={run}",
            *common,
        ]
    )
    assert code == 0
    from lerobot.checkpoints import load_policy

    policy = load_policy(run)
    assert "observation.environment_state" not in policy.config.input_features
    assert policy.config.image_features == {"observation.image": [3, 96, 96]}


def test_action_repeat_sums_rewards_and_tdmpc_trains_online_on_one_task(tmp_path):
    """TD-MPC2's MetaWorld protocol (action repeat 2, 100-step episodes): a repeated step is two MetaWorld
    steps with their rewards summed; TD-MPC learns online on env=metaworld with a tiny model."""
    once, twice = MetaWorldEnv(task="reach-v3"), MetaWorldEnv(task="reach-v3", action_repeat=2)
    try:
        once.reset(seed=3)
        twice.reset(seed=3)
        action = np.full(4, 0.5, dtype=np.float32)
        first = once.step(action)
        second = once.step(action)
        repeated = twice.step(action)
        np.testing.assert_array_equal(repeated[0]["state"], second[0]["state"])
        assert repeated[1] == pytest.approx(first[1] + second[1])
    finally:
        once.close()
        twice.close()

    from lerobot.cli.train import train_main

    code = train_main(
        [
            "+experiment=tdmpc_metaworld",
            "env.max_episode_steps=10",
            "policy.latent_dim=16",
            "policy.enc_dim=32",
            "policy.mlp_dim=32",
            "policy.horizon=2",
            "policy.iterations=1",
            "policy.num_samples=8",
            "policy.num_elites=2",
            "policy.num_pi_trajs=1",
            "training.steps=30",
            "training.batch_size=8",
            "training.learning_starts=10",
            "training.initial_updates=2",  # the recipe's 5,000 updates on the seed data take minutes
            "training.save_freq=30",
            "training.save_buffer=false",
            "training.log_freq=10",
            "eval.freq=30",
            "eval.n_episodes=1",
            "eval.batch_size=1",
            "eval.max_episodes_rendered=0",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    assert code == 0
    info = json.loads(next((tmp_path / "run" / "eval").glob("step_*/eval_info.json")).read_text())
    assert [r["task"] for r in info["per_episode"]] == ["reach-v3"] and info["per_episode"][0][
        "n_steps"
    ] == 10


def test_a_recipe_without_its_recorded_demonstrations_says_how_to_record_them(tmp_path, capsys):
    from lerobot.cli.train import train_main

    missing = tmp_path / "not_recorded"
    code = train_main(
        [
            "+experiment=diffusion_metaworld_mt10_cpu",
            f"dataset.root={missing}",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"dataset.root={missing}: no such directory" in err and "eval.record_dataset=DIR" in err
    assert not (tmp_path / "run").exists()
