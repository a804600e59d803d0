"""Evaluation on a small machine, round 4: which checkpoint an evaluation read, env counts that fit the
machine, torch-free workers from the scripts, watchable real-time videos, `plot_runs.py` before the first
evaluation, the README's set-up, a torchvision that does not match torch, and a failed launch's lock file."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_checkpoint_faults import KEYPOINTS, one_line_error, tiny_checkpoint
from test_diffusion import stats_for
from test_plot_runs import plot_runs, write_run
from toy_env import make_toy

from lerobot.checkpoints.run_layout import MODEL_FILE, checkpoint_dir
from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import CONFIG_DIR, EnvConfig, env_config
from lerobot.envs import factory
from lerobot.errors import EnvWorkerError
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.runtime.checksums import read_checksums
from lerobot.training.run_dir.lock import LOCK_FILE
from lerobot.training.run_dir.saving import save_checkpoint

REPO = Path(__file__).resolve().parents[1]
# One short episode of the tiny Diffusion Policy of `tiny_checkpoint`, no video.
QUICK_EVAL = [
    "eval.n_episodes=1",
    "eval.batch_size=1",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=0",
    "env.max_episode_steps=3",
    "device=cpu",
]


def env_yaml(name: str, **gym_kwargs: object) -> EnvConfig:
    """`configs/env/<name>.yaml` as an `EnvConfig`, with `gym_kwargs` added."""
    cfg = OmegaConf.merge(
        OmegaConf.structured(EnvConfig), OmegaConf.load(CONFIG_DIR / "env" / f"{name}.yaml")
    )
    cfg.gym_kwargs.update(gym_kwargs)
    return OmegaConf.to_object(cfg)


# ------------------------------------------------------------------ which checkpoint an evaluation read
def test_evaluating_a_run_names_the_checkpoint_its_step_checksum_and_ema_weights(tmp_path, capsys, caplog):
    """A run directory is evaluated from its newest checkpoint (a run that trains on writes more): the log,
    the console and eval_info.json name that checkpoint itself, its step, the sha256 of its weights and that
    they are the EMA ones."""
    run = tmp_path / "run"
    tiny_checkpoint(run, 2)
    # policy=diffusion trains with EMA: model.safetensors holds the averaged weights.
    tiny_checkpoint(run, 4)
    newest = checkpoint_dir(run, 4).resolve()
    sha256 = read_checksums(newest)[MODEL_FILE]
    out = tmp_path / "eval"
    with caplog.at_level(logging.INFO, logger="lerobot.cli.eval"):
        assert eval_main(["--checkpoint", str(run), *QUICK_EVAL, "--output-dir", str(out)]) == 0
    recorded = json.loads((out / "eval_info.json").read_text())["checkpoint"]
    assert recorded == {"path": str(newest), "step": 4, "sha256": sha256, "weights": "ema"}
    line = f"checkpoint {newest} (step 4, model.safetensors sha256 {sha256[:16]}, EMA weights)"
    assert line in capsys.readouterr().out  # the summary
    assert f"evaluating {line}" in caplog.messages  # the start-up line


def test_raw_weights_are_recorded_as_raw(tmp_path, capsys):
    cfg = compose_config(KEYPOINTS)
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    policy = make_policy(policy_cfg, dataset_stats=stats_for(policy_cfg))
    raw = policy.state_dict()
    state = {"model": raw, "ema": {"shadow_params": list(raw.values())}, "step": 6}
    ckpt = save_checkpoint(tmp_path / "run", checkpoint_files(6, policy, cfg, state))
    out = tmp_path / "eval"
    assert eval_main(["--checkpoint", str(ckpt), "--raw-weights", *QUICK_EVAL, "--output-dir", str(out)]) == 0
    recorded = json.loads((out / "eval_info.json").read_text())["checkpoint"]
    assert recorded["step"] == 6 and recorded["weights"] == "raw"
    assert "(step 6, model.safetensors sha256 " in capsys.readouterr().out


def test_info_shows_where_the_evaluation_writes_not_the_training_run(tmp_path, capsys):
    run = tmp_path / "run"
    tiny_checkpoint(run, 2)
    assert eval_main(["--checkpoint", str(run), "--info", "--output-dir", str(tmp_path / "e")]) == 0
    text = capsys.readouterr().out
    assert f"evaluation results: {tmp_path / 'e'}" in text and f"output_dir: {run}" not in text
    assert eval_main(["--checkpoint", str(run), "--info"]) == 0
    assert "evaluation results: a new outputs/eval/<date>/<time>_pusht_keypoints_diffusion" in (
        capsys.readouterr().out
    )


# ------------------------------------------------------------------------ env counts that fit the machine
def test_auto_batch_size_fits_the_cores_and_memory_and_says_so(monkeypatch):
    cfg = env_yaml("pusht_keypoints")
    monkeypatch.setattr(factory, "usable_cores", lambda: 2)
    monkeypatch.setattr(factory, "available_memory_mb", lambda: 22_000.0)
    plan = factory.plan_vector_env("auto", "auto", cfg, 200)
    assert (plan.n_envs, plan.use_async) == (50, False)
    assert plan.line == "eval.batch_size=auto: 50 envs (at most 50), eval.use_async_envs=auto: sync (2 cores)"
    assert (
        factory.plan_vector_env("auto", "false", cfg, 3).line
        == "eval.batch_size=auto: 3 envs (one per episode), sync"
    )
    # Async workers are processes of their own: as many as fit in half of the memory available.
    monkeypatch.setattr(factory, "available_memory_mb", lambda: 4_000.0)
    plan = factory.plan_vector_env("auto", "true", cfg, 200)
    assert (plan.n_envs, plan.use_async) == (5, True)
    assert plan.line == "eval.batch_size=auto: 5 envs (what fits in 50% of the 3.9 GB available), async"
    # Set by hand, nothing is said.
    assert factory.plan_vector_env(8, "false", cfg, 200) == factory.VectorEnvPlan(8, False, None)


def test_the_readme_baseline_commands_start_with_auto_and_say_so(tmp_path, caplog):
    """No eval.batch_size given, as in the README's commands: the default is auto, said in one line."""
    assert compose_config(["policy=random", "env=pusht_keypoints"]).eval.batch_size == "auto"
    argv = ["policy=random", "env=pusht_keypoints", "eval.n_episodes=3", "env.max_episode_steps=2"]
    with caplog.at_level(logging.INFO, logger="lerobot.evaluation"):
        assert eval_main([*argv, "eval.max_episodes_rendered=0", "--output-dir", str(tmp_path / "e")]) == 0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval.batch_size=auto")]
    assert len(said) == 1 and said[0].startswith("eval.batch_size=auto: 3 envs (one per episode)"), said


def test_workers_that_cannot_start_are_counted_and_the_fix_named(monkeypatch, capsys):
    """Five workers stuck at start-up: the line names three and counts the others (50 names made 1.4 kB)."""
    monkeypatch.setattr(factory, "ASYNC_START_TIMEOUT_S", 2.0)
    stuck = [functools.partial(make_toy, worker_start_delay_s=60)] * 5
    with pytest.raises(EnvWorkerError) as caught:
        factory._AsyncVectorEnv(stuck, context="spawn")
    message = str(caught.value)
    assert re.match(
        r"env worker 0 \(pid \d+\), env worker 1 \(pid \d+\), env worker 2 \(pid \d+\) and 2 more of 5",
        message,
    )
    assert "short of memory or cores" in message and len(message) < 300, message

    def no_start(*args: object, **kwargs: object) -> None:
        raise caught.value

    monkeypatch.setattr("lerobot.evaluation.make_env", no_start)
    argv = ["policy=random", "env=pusht_keypoints", "eval.n_episodes=4", "eval.use_async_envs=true"]
    assert eval_main([*argv, "eval.max_episodes_rendered=0"]) == 2
    assert one_line_error(capsys).endswith("lower eval.batch_size (now 4) or set eval.use_async_envs=false")


@pytest.mark.parametrize("script", ["eval.py", "train.py"])
def test_the_scripts_import_no_torch_into_the_env_workers(script):
    """A forkserver or spawn worker runs the main script again as `__mp_main__`: nothing above the
    `if __name__ == "__main__"` of the scripts may import torch (~500 MB in each of 50 workers)."""
    code = (
        "import runpy, sys\n"
        f"runpy.run_path({str(REPO / 'scripts' / script)!r}, run_name='__mp_main__')\n"
        "print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


# ------------------------------------------------------------------------------ watchable real-time videos
def test_metaworld_videos_are_256_px_whatever_the_observation_and_play_in_real_time():
    pytest.importorskip("metaworld", reason="MetaWorld envs need the [mujoco] extra")
    from lerobot.envs.metaworld import MetaWorldEnv

    state = MetaWorldEnv(task="reach-v3", render_mode="rgb_array")
    pixels = MetaWorldEnv(task="reach-v3", obs_type="pixels_agent_pos", render_mode="rgb_array")
    try:
        state.reset(seed=0)
        observation, _ = pixels.reset(seed=0)
        assert state.render().shape == (256, 256, 3) and pixels.render().shape == (256, 256, 3)
        again, _ = pixels.reset(seed=0)  # the videos' renderer leaves the observations as they were
        assert observation["pixels"].shape == (96, 96, 3)
        assert (again["pixels"] == observation["pixels"]).all()
    finally:
        state.close()
        pixels.close()
    # 5 MuJoCo steps of 2.5 ms per env step: 80 per second, 40 with TD-MPC's action repeat of 2.
    assert state.metadata["render_fps"] == 80
    assert MetaWorldEnv(task="reach-v3", action_repeat=2).metadata["render_fps"] == 40


def test_dmc_videos_are_256_px():
    pytest.importorskip("dm_control", reason="DeepMind Control envs need the [mujoco] extra")
    from lerobot.envs.dmc import DMCEnv

    env = DMCEnv("cartpole", "swingup", render_mode="rgb_array")
    try:
        env.reset(seed=0)
        assert env.render().shape == (256, 256, 3)
        assert env.metadata["render_fps"] == 50  # 1 / (control timestep 0.01 s x action repeat 2)
    finally:
        env.close()


# ------------------------------------------------------------------------------- plot_runs.py, the README
def test_plot_runs_before_the_first_evaluation_says_there_is_none_yet(tmp_path, capsys):
    run = write_run(tmp_path / "run", [{"step": s, "split": "train", "time": float(s)} for s in (10, 20)])
    with pytest.raises(SystemExit) as stopped:
        plot_runs.main([str(run), "--out", str(tmp_path / "c.png")])
    assert "holds no evaluation yet (2 training records, up to step 20)" in str(stopped.value)
    assert "eval.freq=0?" not in str(stopped.value)
    with pytest.raises(SystemExit):
        plot_runs.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(with their 95% intervals where recorded) against hours of training or training steps." in text


def test_the_readme_installs_the_cpu_torch_first_and_names_the_mujoco_extra():
    readme = (REPO / "README.md").read_text()
    cpu_build = readme.index("pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu")
    assert cpu_build < readme.index("pip install -e .")
    assert 'pip install -e ".[mujoco]"' in readme[: readme.index("## Results")]


def test_a_torchvision_of_another_torch_build_is_one_line_naming_both_at_start_up(tmp_path):
    """Before the data is read (no data here: that error would come next), and before the run directory."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    run = tmp_path / "run"
    argv = [
        "policy=diffusion",
        "env=pusht_keypoints",
        f"dataset.root={tmp_path / 'nowhere'}",
        f"output_dir={run}",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert f"does not load with torch {torch.__version__} (operator torchvision::nms does not exist)" in line
    assert line.startswith("error: torchvision ") and "--force-reinstall torch torchvision" in line
    assert not run.exists()


# ------------------------------------------------------------------------------------ a failed launch
def test_a_failed_launch_into_an_existing_directory_leaves_no_lock_file(tmp_path, monkeypatch, capsys):
    """hydra.run.dir names a directory of the user's: a launch that fails at start-up (no data) leaves it as
    it found it, without a run.lock."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    missing = [f"dataset.root={tmp_path / 'nowhere'}", f"dataset.cache_dir={tmp_path / 'cache'}"]
    assert train_main([*KEYPOINTS, *missing, f"hydra.run.dir={mine}"]) == 2
    assert "nowhere" in one_line_error(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and not (mine / LOCK_FILE).exists()
