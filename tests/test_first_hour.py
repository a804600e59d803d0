"""A newcomer's first hour: the main command fits the machine (`recipe=auto|cpu|paper`), Hydra's flags
(`--help` with the catalog, `--cfg job`, `--info`, `--hydra-help`) on both scripts, and the README's front page.

The suite runs with `LEROBOT_RECIPE=paper` (tests/conftest.py); the tests of the rule pass `recipe=` or set the
variable themselves.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_dataset import ZARR, write_fake_zarr
from test_train import TINY

from lerobot.cli import compose_train_config, eval_main, train_main
from lerobot.cli.compose import group_options
from lerobot.cli.recipes import cpu_recipes, recipe_choices
from lerobot.cli.sweep import sweep_jobs, sweep_recipe
from lerobot.config import CONFIG_DIR, RECIPE_ENV
from lerobot.errors import ConfigError
from lerobot.policy_registry import available_policies
from lerobot.training.pace import CpuPace, cpu_run_estimate

REPO_ROOT = Path(__file__).resolve().parents[1]
MAIN = ["policy=diffusion", "env=pusht"]  # the README's main command
PAPER_DOWN_DIMS = [512, 1024, 2048]  # DiffusionConfig's default, the paper's U-Net


@pytest.fixture
def on_gpu(monkeypatch):
    """`device=auto` resolves to CUDA, as on a GPU machine (only the rule asks; nothing runs on it)."""
    monkeypatch.setattr("lerobot.distributed.auto_device", lambda: "cuda")


@pytest.fixture
def on_cpu(monkeypatch):
    """`device=auto` resolves to the CPU, whatever this machine has."""
    monkeypatch.setattr("lerobot.distributed.auto_device", lambda: "cpu")


def recipe_lines(caplog) -> list[str]:
    """The start-up lines of the recipe rule among the captured log records."""
    return [r.getMessage() for r in caplog.records if r.name == "lerobot.cli.compose"]


# ---------------------------------------------------------------------------------- the recipe rule
def test_the_main_command_on_a_cpu_composes_the_image_cpu_recipe_and_says_so(on_cpu, caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config([*MAIN, "recipe=auto"])
    assert cfg.recipe == "auto" and cfg.recipe_applied == "diffusion_pusht_image_cpu"
    assert list(cfg.policy.down_dims) == [64, 128, 256] and cfg.policy.vision_backbone_stages == 3
    assert cfg.training.steps == 16000 and cfg.env.name == "pusht"
    lines = recipe_lines(caplog)
    assert len(lines) == 1
    assert "diffusion_pusht_image_cpu" in lines[0] and "recipe=paper" in lines[0] and "no GPU" in lines[0]


def test_device_cpu_picks_the_recipe_too(caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config(["policy=diffusion", "env=pusht_keypoints", "device=cpu", "recipe=auto"])
    assert cfg.recipe_applied == "diffusion_pusht_keypoints_cpu"
    assert cfg.training.steps == 24000 and list(cfg.policy.down_dims) == [64, 128, 256]
    assert "device=cpu" in recipe_lines(caplog)[-1]


def test_on_a_gpu_the_main_command_trains_the_paper_model(on_gpu, caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config([*MAIN, "recipe=auto"])
    assert cfg.recipe_applied is None
    assert list(cfg.policy.down_dims) == PAPER_DOWN_DIMS and cfg.training.steps == 100_000
    (line,) = recipe_lines(caplog)
    assert "paper-size model" in line and "recipe=cpu" in line and "diffusion_pusht_image_cpu" in line


def test_recipe_paper_forces_the_paper_model_on_a_cpu(on_cpu, caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config([*MAIN, "recipe=paper"])
    assert cfg.recipe == "paper" and cfg.recipe_applied is None
    assert list(cfg.policy.down_dims) == PAPER_DOWN_DIMS and cfg.policy.vision_backbone_stages == 4
    assert "recipe=auto" in recipe_lines(caplog)[-1]


def test_recipe_cpu_composes_the_cpu_recipe_on_a_gpu(on_gpu):
    cfg = compose_train_config(["policy=act", "env=pusht_keypoints", "recipe=cpu"])
    assert cfg.recipe_applied == "act_pusht_keypoints_cpu" and cfg.policy.dim_model == 128


def test_explicit_overrides_win_over_the_recipe(on_cpu):
    cfg = compose_train_config([*MAIN, "recipe=auto", "training.steps=50", "policy.down_dims=[32,64]"])
    assert cfg.recipe_applied == "diffusion_pusht_image_cpu"
    assert cfg.training.steps == 50 and list(cfg.policy.down_dims) == [32, 64]
    assert cfg.policy.optimizer_lr == 3e-4 and cfg.eval.freq == 4000  # the rest is the recipe's


def test_an_explicit_experiment_wins_and_turns_the_rule_off(on_cpu, caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config(["+experiment=diffusion_pusht_gpu", "recipe=auto"])
    assert cfg.recipe_applied == "diffusion_pusht_gpu" and list(cfg.policy.down_dims) == PAPER_DOWN_DIMS
    assert cfg.training.use_amp == "true"
    assert not recipe_lines(caplog)  # the command named its recipe
    cfg = compose_train_config(["+experiment=diffusion_pusht_keypoints_cpu", "recipe=paper"])
    assert cfg.recipe_applied == "diffusion_pusht_keypoints_cpu" and cfg.training.steps == 24000


@pytest.mark.parametrize("name", sorted(cpu_recipes([CONFIG_DIR])))
def test_every_cpu_recipe_is_picked_for_its_own_policy_and_env(on_cpu, name):
    policy, env = recipe_choices(CONFIG_DIR / "experiment" / f"{name}.yaml")
    cfg = compose_train_config([f"policy={policy}", f"env={env}", "recipe=auto"])
    assert cfg.recipe_applied == name
    assert compose_train_config([f"policy={policy}", f"env={env}", "recipe=paper"]).recipe_applied is None


def test_no_cpu_recipe_leaves_the_defaults_and_recipe_cpu_names_the_ones_there_are(on_cpu, caplog):
    with caplog.at_level(logging.INFO, logger="lerobot.cli.compose"):
        cfg = compose_train_config(["policy=tdmpc", "env=pendulum", "recipe=auto"])
    assert cfg.recipe_applied is None and not recipe_lines(caplog)
    with pytest.raises(ConfigError, match="has no CPU recipe; CPU recipes: ") as error:
        compose_train_config(["policy=tdmpc", "env=pendulum", "recipe=cpu"])
    assert ", ".join(cpu_recipes([CONFIG_DIR])) in str(error.value)


def test_a_bad_recipe_value_is_one_line(monkeypatch):
    with pytest.raises(ConfigError, match=r"^recipe=big: expected one of auto, cpu, paper$"):
        compose_train_config([*MAIN, "recipe=big"])
    monkeypatch.setenv(RECIPE_ENV, "gpu")
    with pytest.raises(ConfigError, match="recipe=gpu: expected one of auto, cpu, paper"):
        compose_train_config(MAIN)


def test_the_environment_sets_the_default_and_the_command_line_wins(on_cpu, monkeypatch):
    assert compose_train_config(MAIN).recipe_applied is None  # LEROBOT_RECIPE=paper in this suite
    monkeypatch.delenv(RECIPE_ENV)
    cfg = compose_train_config(MAIN)
    assert cfg.recipe == "auto" and cfg.recipe_applied == "diffusion_pusht_image_cpu"
    monkeypatch.setenv(RECIPE_ENV, "auto")
    assert compose_train_config([*MAIN, "recipe=paper"]).recipe_applied is None


def test_a_cpu_recipe_in_a_config_dir_is_found_and_two_for_one_pair_are_refused(on_cpu, tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "env").mkdir()  # a config dir holds env/ or policy/ (compose.check_config_dirs)
    recipe = "# @package _global_\n# TD-MPC on Pendulum, tiny.\ndefaults:\n  - override /env: pendulum\n"
    recipe += "  - override /policy: tdmpc\ntraining:\n  steps: 7\n"
    (tmp_path / "experiment" / "tdmpc_pendulum_cpu.yaml").write_text(recipe)
    cfg = compose_train_config(["policy=tdmpc", "env=pendulum", "recipe=auto"], search_path=[tmp_path])
    assert cfg.recipe_applied == "tdmpc_pendulum_cpu" and cfg.training.steps == 7
    (tmp_path / "experiment" / "pendulum_again_cpu.yaml").write_text(recipe)
    with pytest.raises(ConfigError, match="pendulum_again_cpu and tdmpc_pendulum_cpu are both CPU recipes"):
        compose_train_config(["policy=tdmpc", "env=pendulum", "recipe=auto"], search_path=[tmp_path])


# ------------------------------------------------------------------- a run records what was chosen
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, list[str], list[str]]:
    """A 4-step run of the keypoints CPU recipe (shrunk by overrides) on a fake dataset, with `recipe=cpu`;
    returns its run directory, its arguments and the log lines it wrote."""
    base = tmp_path_factory.mktemp("first_hour")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    data = [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]
    args = [*TINY, "env=pusht_keypoints", *data, "recipe=cpu", "training.steps=4", "eval.freq=0"]
    args += ["training.use_amp=false", "training.save_freq=4", f"output_dir={base / 'run'}"]
    handler, root = _Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        assert train_main(args) == 0
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return base / "run", args, handler.lines


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_saved_config_records_the_recipe_and_the_start_up_says_it_once(tiny_run):
    run_dir, _, lines = tiny_run
    saved = OmegaConf.load(run_dir / "checkpoints" / "last" / "config.yaml")
    assert saved.recipe == "cpu" and saved.recipe_applied == "diffusion_pusht_keypoints_cpu"
    assert saved.policy.optimizer_lr == 3e-4 and list(saved.policy.down_dims) == [16, 32]
    assert len([line for line in lines if line.startswith("recipe: ")]) == 1
    assert len([line for line in lines if line.startswith("estimate: ")]) == 1  # after step 3 of 4


def test_a_cpu_run_estimates_its_time_once_after_its_first_steps(caplog):
    pace = CpuPace(torch.device("cpu"), steps_left=16_000)
    with caplog.at_level(logging.INFO, logger="lerobot.training.pace"):
        for _ in range(5):
            pace.step()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("estimate: the training steps take about ") and "15,997 steps left" in line
    assert "about 1.7 hours more" in cpu_run_estimate(step_s=0.39, steps_left=16_000)  # the image recipe
    assert "about 12 minutes more" in cpu_run_estimate(step_s=0.146, steps_left=5_000)


def test_the_same_command_resumes_its_run(tiny_run):
    run_dir, args, _ = tiny_run
    assert train_main([*[a for a in args if not a.startswith("training.steps=")], "training.steps=5"]) == 0
    assert (run_dir / "checkpoints" / "000000005").is_dir()


# ------------------------------------------------------------------------------------------- sweeps
def test_a_sweep_composes_one_recipe_for_all_its_jobs(on_cpu, caplog):
    jobs = sweep_jobs(["policy=diffusion", "env=pusht_keypoints", "recipe=auto", "seed=1,2"])
    with caplog.at_level(logging.INFO, logger="lerobot.cli.sweep"):
        assert sweep_recipe(jobs) == "diffusion_pusht_keypoints_cpu"
    assert len([r for r in caplog.records if r.getMessage().startswith("recipe: ")]) == 1
    assert sweep_recipe(sweep_jobs(["env=pusht_keypoints", "recipe=paper", "seed=1,2"])) is None
    with pytest.raises(ConfigError, match="recipe=auto picks a different recipe per job of this sweep"):
        sweep_recipe(sweep_jobs(["policy=diffusion", "env=pusht,pusht_keypoints", "recipe=auto"]))


def test_each_job_of_a_sweep_records_its_recipe(tiny_run, tmp_path):
    _, args, _ = tiny_run
    data = [a for a in args if a.startswith("dataset.")]
    job = [*TINY, "env=pusht_keypoints", *data, "recipe=cpu", "training.steps=2", "training.save_freq=2"]
    sweep = tmp_path / "sweep"
    assert train_main(["-m", *job, "eval.freq=0", "seed=1,2", f"hydra.sweep.dir={sweep}"]) == 0
    for n in ("0", "1"):
        saved = OmegaConf.load(sweep / n / "checkpoints" / "last" / "config.yaml")
        assert saved.recipe == "cpu" and saved.recipe_applied == "diffusion_pusht_keypoints_cpu"
        assert saved.policy.optimizer_lr == 3e-4 and saved.training.steps == 2


# ------------------------------------------------------------------------------------ Hydra's flags
def test_train_help_lists_every_env_policy_and_experiment_and_the_settings(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in [*group_options("env"), *available_policies(), *group_options("experiment")]:
        assert f"\n  {name} " in out, name
    assert "  diffusion_pusht_image_cpu *" in out and "  diffusion_pusht_gpu " in out  # * marks CPU recipes
    for setting in (
        "recipe=",
        "device=auto",
        "training.steps=100000",
        "eval.freq=10000",
        "dataset.root=null",
    ):
        assert f"\n  {setting}" in out, setting
    assert "--cfg {job}" in out and "--hydra-help" in out


def test_help_lists_what_a_config_dir_adds(tmp_path, capsys):
    (tmp_path / "env").mkdir()
    text = (CONFIG_DIR / "env" / "pusht_keypoints.yaml").read_text().replace("PushT from", "My PushT from")
    (tmp_path / "env" / "my_pusht.yaml").write_text(text)
    with pytest.raises(SystemExit):
        train_main(["--config-dir", str(tmp_path), "--help"])
    assert re.search(r"\n  my_pusht +My PushT from low-dimensional state\n", capsys.readouterr().out)


def test_cfg_job_prints_the_resolved_config_and_trains_nothing(tmp_path, capsys, on_cpu):
    run_dir = tmp_path / "run"
    assert train_main(["--cfg", "job", *MAIN, "recipe=auto", f"output_dir={run_dir}", "seed=7"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.recipe_applied == "diffusion_pusht_image_cpu" and printed.seed == 7
    assert printed.policy.name == "diffusion" and list(printed.policy.down_dims) == [64, 128, 256]
    assert printed.output_dir == str(run_dir) and not run_dir.exists()


def test_cfg_job_validates_first(capsys):
    assert train_main(["--cfg", "job", *MAIN, "training.steps=0"]) == 2
    assert "training.steps=0 must be a positive number" in capsys.readouterr().err


def test_info_and_hydra_help_exit_zero_and_sweeps_refuse_cfg(tmp_path, capsys, on_cpu):
    assert train_main(["--info", *MAIN, "recipe=auto", f"output_dir={tmp_path / 'x'}"]) == 0
    out = capsys.readouterr().out
    assert "experiment composed: diffusion_pusht_image_cpu" in out and str(CONFIG_DIR) in out
    assert "device: auto (cpu here)" in out and not (tmp_path / "x").exists()
    assert train_main(["--hydra-help"]) == 0
    out = capsys.readouterr().out
    assert "--cfg job" in out and "--cfg hydra" in out and "Not available, and why" in out
    assert train_main(["-m", "--cfg", "job", "seed=1,2"]) == 2
    assert "drop -m" in capsys.readouterr().err


def test_eval_help_cfg_job_and_hydra_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        eval_main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in [*group_options("env"), *available_policies()]:
        assert f"\n  {name} " in out, name
    assert "eval.n_episodes=50" in out and "--cfg {job}" in out
    out_dir = tmp_path / "eval"
    assert (
        eval_main(["--cfg", "job", "policy=random", "env=pusht_keypoints", "--output-dir", str(out_dir)]) == 0
    )
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.policy.name == "random" and printed.env.name == "pusht_keypoints" and not out_dir.exists()
    assert eval_main(["--hydra-help"]) == 0 and "--cfg job" in capsys.readouterr().out


def test_eval_cfg_job_of_a_checkpoint_shows_its_config_with_the_overrides(tiny_run, tmp_path, capsys):
    run_dir, _, _ = tiny_run
    argv = [
        "--checkpoint",
        str(run_dir),
        "--cfg",
        "job",
        "eval.n_episodes=3",
        "--output-dir",
        str(tmp_path / "e"),
    ]
    assert eval_main(argv) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.eval.n_episodes == 3 and printed.recipe_applied == "diffusion_pusht_keypoints_cpu"
    assert not (tmp_path / "e").exists()
    assert eval_main(["--checkpoint", str(run_dir), "--info"]) == 0
    assert f"checkpoint {run_dir}" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- the front page
def test_the_readme_states_the_rule_on_its_first_screen_and_keeps_the_ci_command():
    readme = (REPO_ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.splitlines()[:40])
    assert "python scripts/train.py policy=diffusion env=pusht" in first_screen
    assert "recipe=paper" in first_screen and "CPU recipe" in first_screen
    assert "--index-url https://download.pytorch.org/whl/cpu" in first_screen
    assert 'pip install -e ".[test]" && python -m pytest -q' in readme
