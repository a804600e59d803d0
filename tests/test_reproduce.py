"""The reproduction queues (TD-MPC, SAC): their commands are valid runs, and the report reads resumed runs right."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from lerobot.cli import compose_config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce.py"
spec = importlib.util.spec_from_file_location("reproduce", SCRIPT)
reproduce = importlib.util.module_from_spec(spec)
sys.modules["reproduce"] = reproduce  # its dataclasses look their module up
spec.loader.exec_module(reproduce)


def _args(
    root: Path, size: str = "cpu", overrides=(), tag: str = "", policy: str = "tdmpc"
) -> argparse.Namespace:
    runs = list(reproduce.REPRODUCTIONS[policy].tasks)
    return argparse.Namespace(
        root=str(root), size=size, seeds=[1], runs=runs, set=list(overrides), tag=tag, policy=policy
    )


def _write_metrics(run_dir: Path, *rows: dict) -> None:
    """A run's metrics log (`metrics.jsonl`), one record per line, as the trainer writes it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("policy", ["tdmpc", "sac", "sac_pixels"])
@pytest.mark.parametrize("size", ["cpu", "paper"])
def test_every_queued_run_is_a_valid_config_of_its_recipe(tmp_path, size, policy):
    for name, task in reproduce.REPRODUCTIONS[policy].tasks.items():
        command = reproduce._command(_args(tmp_path, size, policy=policy), name, 1)
        cfg = compose_config(command[2:])  # past the interpreter and scripts/train.py
        assert cfg.policy.name == policy.removesuffix("_pixels") and cfg.training.steps == task.agent_steps
        env = "metaworld" if task.suite == "metaworld" else name.join(["dmc_", ""])
        assert cfg.env.name == (f"{env}_pixels" if policy == "sac_pixels" else env)
        # The runs train the published budget: DrQ's 100,000 simulator steps at the task's action repeat.
        assert task.agent_steps * task.step_scale == reproduce.STEPS
        assert task.step_scale == cfg.env.gym_kwargs.get("action_repeat", 1) ** (policy == "sac_pixels")
        assert cfg.output_dir == str(tmp_path / size / f"{name}_s1")


def test_report_keeps_the_last_of_a_repeated_evaluation_and_its_training_hours(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "cpu" / "cartpole_swingup_s1"
    rows = [
        {"split": "train", "step": 10_000, "train_time_s": 360.0},
        {"split": "eval", "step": 10_000, "avg_sum_reward": 300.0},
        {"split": "eval", "step": 10_000, "avg_sum_reward": 310.0},  # redone by a resumed run
        {"split": "train", "step": 20_000, "train_time_s": 1080.0},
        {"split": "eval", "step": 20_000, "avg_sum_reward": 863.1},
    ]
    _write_metrics(run_dir, *rows)
    monkeypatch.setattr(reproduce, "RESULTS_DIR", tmp_path)
    assert not reproduce._finished(run_dir, reproduce.REPRODUCTIONS["tdmpc"].tasks["cartpole_swingup"])
    reproduce.report(_args(tmp_path))
    run = json.loads((tmp_path / "tdmpc_reproduce.json").read_text())["runs"]["cartpole_swingup_s1"]
    assert run["curve"] == [
        {"step": 10_000, "train_hours": 0.1, "avg_sum_reward": 310.0},
        {"step": 20_000, "train_hours": 0.3, "avg_sum_reward": 863.1},
    ]
    assert "| cartpole_swingup_s1 | 863.1 | 10k: 310, 20k: 863 | 0.30 | running |" in capsys.readouterr().out
    for plot in ("tdmpc_reproduce.png", "tdmpc_reproduce_hours.png"):
        assert (tmp_path / plot).stat().st_size > 0


def test_a_figure_matches_within_ten_percent_or_inside_the_seeds_spread():
    assert reproduce.verdict(800.0, 863.1, None) == "800.0 (0.93x): match"
    assert reproduce.verdict(740.0, 832.2, (734.1, 934.0)) == "740.0 (0.89x): match"
    assert reproduce.verdict(700.0, 832.2, (734.1, 934.0)) == "700.0 (0.84x): short"
    assert reproduce.verdict(100.0, 63.0, None) == "100.0 (1.59x): above"


def test_a_variant_trains_with_its_overrides_in_its_own_directory_and_report_files(
    tmp_path, monkeypatch, capsys
):
    args = _args(tmp_path, overrides=["training.per_alpha=0.6"], tag="per")
    cfg = compose_config(reproduce._command(args, "mw_push", 1)[2:])
    assert cfg.training.per_alpha == 0.6 and cfg.env.task == "push-v3"
    assert cfg.output_dir == str(tmp_path / "cpu-per" / "mw_push_s1")

    run_dir = tmp_path / "cpu-per" / "mw_push_s1"
    _write_metrics(
        run_dir,
        {"split": "train", "step": 100_000, "train_time_s": 3600.0},
        {"split": "eval", "step": 100_000, "pc_success": 60.0},
    )
    monkeypatch.setattr(reproduce, "RESULTS_DIR", tmp_path)
    reproduce.report(args)
    assert not (tmp_path / "tdmpc_reproduce.json").exists()  # the recipes' report is left alone
    out = json.loads((tmp_path / "tdmpc_reproduce_per.json").read_text())
    assert out["overrides"] == ["training.per_alpha=0.6"] and list(out["runs"]) == ["mw_push_s1"]
    assert (tmp_path / "tdmpc_reproduce_per.png").exists()
    assert (tmp_path / "tdmpc_reproduce_hours_per.png").exists()
    # TD-MPC's published success (mean of 3 seeds: 80, 20, 60) with TD-MPC2's beside it; 60 is in the seeds' spread.
    assert (
        "| mw_push_s1 | 53.3 (TD-MPC2: 63.3) | 100k: 60 | 1.00 | 60.0 (1.13x): match |"
        in capsys.readouterr().out
    )


def test_sac_reports_against_its_own_published_figures(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "paper" / "cheetah_run_s2"
    _write_metrics(
        run_dir,
        {"split": "train", "step": 100_000, "train_time_s": 1800.0},
        {"split": "eval", "step": 100_000, "avg_sum_reward": 250.0},
    )
    monkeypatch.setattr(reproduce, "RESULTS_DIR", tmp_path)
    reproduce.report(_args(tmp_path, size="paper", policy="sac"))
    out = json.loads((tmp_path / "sac_reproduce.json").read_text())
    assert (
        out["policy"] == "sac"
        and out["recipes"] == {"dmc": "sac_dmc"}
        and list(out["runs"]) == ["cheetah_run_s2"]
    )
    # TD-MPC2's published SAC at 100k: 362.4, 236.9, 331.1 (mean 310.1); 250 is 0.81x but inside the spread.
    assert "| cheetah_run_s2 | 310.1 | 100k: 250 | 0.50 | 250.0 (0.81x): match |" in capsys.readouterr().out
    assert (tmp_path / "sac_reproduce_hours.png").stat().st_size > 0


def test_the_report_covers_every_run_under_the_root_not_only_the_last_queue(tmp_path, monkeypatch, capsys):
    for key, figure in (
        ("cartpole_swingup_s1", 837.0),
        ("cartpole_swingup_s3", 820.0),
        ("walker_walk_s2", 700.0),
    ):
        _write_metrics(
            tmp_path / "paper" / key,
            {"split": "train", "step": 100_000, "train_time_s": 1500.0},
            {"split": "eval", "step": 100_000, "avg_sum_reward": figure},
        )
    (tmp_path / "paper" / "cartpole_swingup_s2.log").write_text("a queue's log, not a run")
    monkeypatch.setattr(reproduce, "RESULTS_DIR", tmp_path)
    args = _args(tmp_path, size="paper", policy="sac")
    args.seeds, args.runs = [3], ["cartpole_swingup"]  # the queue `run` was last given
    reproduce.report(args)
    out = json.loads((tmp_path / "sac_reproduce.json").read_text())
    runs = out["runs"]
    assert sorted(runs) == ["cartpole_swingup_s1", "cartpole_swingup_s3", "walker_walk_s2"]
    assert runs["cartpole_swingup_s3"]["curve"][-1]["avg_sum_reward"] == 820.0
    # A task with two or more seeds at 100k: their mean, what the published mean of 3 seeds compares with.
    assert out["seed_means"] == {"cartpole_swingup": {"seeds": [837.0, 820.0], "mean": 828.5}}
    assert "| cartpole_swingup | 835.0 | 837.0, 820.0 | 828.5 (0.99x): match |" in capsys.readouterr().out


def test_drq_runs_report_against_simulator_steps(tmp_path, monkeypatch, capsys):
    """DrQ counts simulator steps: cup-catch (action repeat 4) ends at 25,000 agent steps, its evaluations read
    as 4x their agent step, and the figure there is compared with DrQ's at 100k."""
    run_dir = tmp_path / "cpu" / "cup_catch_s1"
    _write_metrics(
        run_dir,
        {"split": "train", "step": 12_500, "train_time_s": 3600.0},
        {"split": "eval", "step": 12_500, "avg_sum_reward": 600.0},
        {"split": "train", "step": 25_000, "train_time_s": 7200.0},
        {"split": "eval", "step": 25_000, "avg_sum_reward": 900.0},
    )
    monkeypatch.setattr(reproduce, "RESULTS_DIR", tmp_path)
    task = reproduce.REPRODUCTIONS["sac_pixels"].tasks["cup_catch"]
    assert reproduce._finished(run_dir, task) and task.agent_steps == 25_000
    reproduce.report(_args(tmp_path, policy="sac_pixels"))
    # DrQ at 96k: 913.8 over 10 seeds in [780.0, 961.7]; 900 is inside.
    assert (
        "| cup_catch_s1 | 913.8 | 50k: 600, 100k: 900 | 2.00 | 900.0 (0.98x): match |"
        in capsys.readouterr().out
    )
