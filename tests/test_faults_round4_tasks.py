"""Nothing silent, round four (tasks and env settings): a checkpoint evaluated on tasks it was not trained on,
a dataset whose tasks differ from `env.task`, an env setting the env cannot take, and an OpenGL backend
(`MUJOCO_GL`) that cannot render. Each case runs the real command (in this process, or as its own process
where `MUJOCO_GL` must be set before MuJoCo loads) and checks its exit code and its one line."""

from __future__ import annotations

import ctypes.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("metaworld", reason="MetaWorld envs need the [mujoco] extra (metaworld==3.1.1)")

from lerobot.cli import eval_main, train_main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORDED_TASKS = ["reach-v3", "drawer-close-v3"]
# A tiny ACT on MetaWorld from state: a few steps of a few frames.
TINY_ACT = [
    "+experiment=act_metaworld_mt10_cpu",
    "policy.dim_model=16",
    "policy.dim_feedforward=32",
    "training.steps=2",
    "training.batch_size=4",
    "training.save_freq=2",
    "training.num_workers=0",
    "env.max_episode_steps=5",
    "eval.n_episodes=1",
    "eval.batch_size=1",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=0",
]
EVAL = ["eval.n_episodes=1", "eval.batch_size=1", "eval.use_async_envs=false", "env.max_episode_steps=5"]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _record(out: Path, env: str, tasks: list[str], work: Path) -> Path:
    """The scripted experts' episodes of `tasks` (2 each, 20 steps at most) recorded as a LeRobotDataset."""
    code = eval_main(
        [
            "policy=metaworld_expert",
            f"env={env}",
            f"env.task=[{','.join(tasks)}]",
            "eval.n_episodes=2",
            "eval.batch_size=2",
            "eval.use_async_envs=false",
            "eval.max_episodes_rendered=0",
            "eval.start_seed=0",
            "env.max_episode_steps=20",
            f"eval.record_dataset={out}",
            "--output-dir",
            str(work / f"{out.name}_eval"),
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> list[str]:
    """Dataset overrides of a recording of reach-v3 and drawer-close-v3 (2 episodes each)."""
    base = tmp_path_factory.mktemp("demos")
    root = _record(base / "demos", "metaworld", RECORDED_TASKS, base)
    return [f"dataset.root={root}", f"dataset.cache_dir={base / 'cache'}"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demos) -> Path:
    """A run trained on both recorded tasks."""
    run = tmp_path_factory.mktemp("trained") / "run"
    code = train_main(
        [*TINY_ACT, *demos, f"env.task=[{','.join(RECORDED_TASKS)}]", "eval.freq=0", f"output_dir={run}"]
    )
    assert code == 0
    return run


# ------------------------------------------------------------------------- tasks a checkpoint was not trained on
def test_a_checkpoint_evaluated_on_a_task_it_was_not_trained_on_is_one_line(trained, tmp_path, capsys):
    out = tmp_path / "eval"
    code = eval_main(["--checkpoint", str(trained), "env.task=[push-v3]", *EVAL, "--output-dir", str(out)])
    assert code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "was trained on env.task=[reach-v3,drawer-close-v3], not on push-v3" in line
    assert "eval.allow_untrained_tasks=true" in line
    assert not out.exists()  # nothing evaluated, nothing written


def test_tasks_it_was_not_trained_on_evaluate_under_the_override_labelled_as_such(trained, tmp_path, capsys):
    out = tmp_path / "eval"
    code = eval_main(
        [
            "--checkpoint",
            str(trained),
            "env.task=[push-v3,reach-v3]",
            "eval.allow_untrained_tasks=true",
            *EVAL,
            "--output-dir",
            str(out),
        ]
    )
    assert code == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert info["tasks_not_trained_on"] == ["push-v3"]
    assert list(info["aggregated"]["per_task"]) == ["push-v3", "reach-v3"]
    printed = capsys.readouterr().out
    assert "push-v3 (not trained on)" in printed and "reach-v3 (not trained on)" not in printed
    assert "not trained on: push-v3 (evaluated with eval.allow_untrained_tasks=true)" in printed
    # Tasks it was trained on (a subset) need no override and carry no label.
    code = eval_main(
        ["--checkpoint", str(trained), "env.task=[drawer-close-v3]", *EVAL, "--output-dir", str(out / "s")]
    )
    assert code == 0
    assert "tasks_not_trained_on" not in json.loads((out / "s" / "eval_info.json").read_text())


# ---------------------------------------------------------------------------- a dataset of other tasks than env.task
def test_a_task_that_the_dataset_lacks_is_one_line_before_any_training(demos, tmp_path, capsys):
    run = tmp_path / "run"
    code = train_main([*TINY_ACT, *demos, "env.task=[push-v3,reach-v3]", "eval.freq=2", f"output_dir={run}"])
    assert code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "env.task names push-v3, but the dataset at" in line
    assert "holds no episode of it (its tasks: drawer-close-v3, reach-v3)" in line
    assert not run.exists()


def test_a_dataset_of_more_tasks_trains_on_those_of_env_task_and_the_config_says_so(demos, tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        code = train_main([*TINY_ACT, *demos, "env.task=[reach-v3]", "eval.freq=0", f"output_dir={run}"])
    assert code == 0
    assert (
        "training on the 2 of 4 episodes of" in caplog.text
        and "left out: the episodes of drawer-close-v3" in caplog.text
    )
    assert "in 2 episodes" in caplog.text  # the dataset the policy trained on
    saved = OmegaConf.load(run / "checkpoints" / "last" / "config.yaml")
    assert list(saved.env.task) == ["reach-v3"]


# ------------------------------------------------------------------------------- env settings, at start-up
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("env.task=[reach-v3,bogus-v3]", "env.task: unknown MetaWorld task or set 'bogus-v3'"),
        (
            "+env.gym_kwargs.bogus=1",
            "env.gym_kwargs.bogus: env 'metaworld' (lerobot.envs.metaworld:MetaWorld-v0) "
            "takes no setting 'bogus'",
        ),
        ("+env.gym_kwargs.action_repeat=0", "env.gym_kwargs.action_repeat=0 must be >= 1"),
    ],
)
def test_an_env_setting_the_env_cannot_take_ends_an_offline_run_at_start_up(
    demos, tmp_path, capsys, override, named
):
    run = tmp_path / "run"
    code = train_main(
        [*TINY_ACT, *demos, "env.task=[reach-v3]", override, "eval.freq=2", f"output_dir={run}"]
    )
    assert code == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert named in line
    assert not run.exists()  # not trained (and saved with a config that cannot be evaluated nor changed)


def test_a_misspelt_env_setting_is_one_line_when_evaluating_too(tmp_path, capsys):
    argv = [
        "policy=metaworld_expert",
        "env=metaworld",
        "env.task=reach-v3",
        "+env.gym_kwargs.fast_rendr=false",
    ]
    assert eval_main([*argv, *EVAL, "--output-dir", str(tmp_path / "eval")]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "env.gym_kwargs.fast_rendr: env 'metaworld'" in line and "fast_render" in line


# ---------------------------------------------------------------------------------------- MUJOCO_GL
def _run(script: str, args: list[str], mujoco_gl: str, cwd: Path) -> subprocess.CompletedProcess:
    """`scripts/<script>` with `args` in a process of its own under `MUJOCO_GL=mujoco_gl`, without a display."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(MUJOCO_GL=mujoco_gl, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# A backend that cannot render here, for what it is missing (skipped where it is not missing).
UNUSABLE = {
    "bogus": "is not an OpenGL backend of MuJoCo",
    "glfw": "needs a display (DISPLAY is not set)",
    "osmesa": "needs libOSMesa, which is not installed",
}
# osmesa is a backend that cannot render only where libOSMesa is missing.
WITHOUT_OSMESA = pytest.mark.skipif(
    ctypes.util.find_library("OSMesa") is not None, reason="libOSMesa is installed: osmesa renders"
)


@pytest.mark.parametrize(
    ("mujoco_gl", "env"),
    [
        pytest.param("bogus", "metaworld", id="bogus-metaworld"),
        pytest.param("osmesa", "metaworld", marks=WITHOUT_OSMESA, id="osmesa-metaworld"),
        pytest.param("glfw", "dmc_cartpole_swingup", id="glfw-dmc"),
    ],
)
def test_a_state_only_evaluation_that_renders_nothing_needs_no_working_mujoco_gl(tmp_path, mujoco_gl, env):
    policy = "metaworld_expert" if env == "metaworld" else "random"
    task = ["env.task=reach-v3"] if env == "metaworld" else []
    args = [
        f"policy={policy}",
        f"env={env}",
        *task,
        *EVAL,
        "eval.max_episodes_rendered=0",
        "--output-dir",
        "eval",
    ]
    done = _run("eval.py", args, mujoco_gl, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # Not a word of OpenGL: no traceback, no GLFW warning (dm_control used to start GLFW at import).
    assert "Traceback" not in done.stderr and "GLFWError" not in done.stderr
    assert (tmp_path / "eval" / "eval_info.json").is_file()


@pytest.mark.parametrize("mujoco_gl", ["bogus", pytest.param("osmesa", marks=WITHOUT_OSMESA)])
def test_an_evaluation_that_records_videos_names_the_backend_at_start_up(tmp_path, mujoco_gl):
    args = [
        "policy=metaworld_expert",
        "env=metaworld",
        "env.task=reach-v3",
        *EVAL,
        "eval.max_episodes_rendered=1",
    ]
    done = _run("eval.py", [*args, "--output-dir", "eval"], mujoco_gl, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = _error_lines(done.stderr)
    assert line.startswith(
        "error: this run renders eval videos (eval.max_episodes_rendered=1; 0 renders none), "
    )
    assert f"MUJOCO_GL={mujoco_gl} {UNUSABLE[mujoco_gl]}" in line
    assert "set MUJOCO_GL=egl (it renders here)" in line or "set MUJOCO_GL=osmesa (it renders here)" in line
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "eval").exists()


@pytest.fixture(scope="module")
def pixel_demos(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("pixel_demos")
    return _record(base / "pixels", "metaworld_pixels_expert", ["reach-v3"], base)


@pytest.mark.parametrize("mujoco_gl", ["glfw", pytest.param("osmesa", marks=WITHOUT_OSMESA)])
def test_an_offline_pixel_run_names_the_backend_before_training_not_at_its_first_evaluation(
    pixel_demos, tmp_path, mujoco_gl
):
    args = [
        "+experiment=diffusion_metaworld_mt10_image_cpu",
        "env.task=reach-v3",
        f"dataset.root={pixel_demos}",
        f"dataset.cache_dir={tmp_path / 'cache'}",
        "policy.down_dims=[16,32]",
        "training.steps=2",
        "training.batch_size=4",
        "training.save_freq=2",
        "training.num_workers=0",
        "eval.freq=2",
        *EVAL,
        "output_dir=run",
    ]
    done = _run("train.py", args, mujoco_gl, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = _error_lines(done.stderr)
    assert line.startswith("error: this run renders camera observations (observation.image), ")
    assert f"MUJOCO_GL={mujoco_gl} {UNUSABLE[mujoco_gl]}" in line
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # nothing trained, nothing saved
