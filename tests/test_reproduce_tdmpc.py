"""The TD-MPC reproduction queue: its commands are valid runs, and its report reads resumed runs right."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from lerobot.cli import compose_config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_tdmpc.py"
spec = importlib.util.spec_from_file_location("reproduce_tdmpc", SCRIPT)
reproduce_tdmpc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce_tdmpc)


def _args(root: Path, size: str = "cpu", overrides=(), tag: str = "") -> argparse.Namespace:
    return argparse.Namespace(
        root=str(root), size=size, seeds=[1], runs=list(reproduce_tdmpc.RUNS), set=list(overrides), tag=tag
    )


@pytest.mark.parametrize("size", ["cpu", "paper"])
def test_every_queued_run_is_a_valid_config_of_its_recipe(tmp_path, size):
    for name, (suite, _, _, _) in reproduce_tdmpc.RUNS.items():
        command = reproduce_tdmpc._command(_args(tmp_path, size), name, 1)
        cfg = compose_config(command[2:])  # past the interpreter and scripts/train.py
        assert cfg.policy.name == "tdmpc" and cfg.training.steps == reproduce_tdmpc.STEPS
        assert cfg.env.name == ("metaworld" if suite == "metaworld" else name.join(["dmc_", ""]))
        assert cfg.output_dir == str(tmp_path / size / f"{name}_s1")


def test_report_keeps_the_last_of_a_repeated_evaluation_and_its_training_hours(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "cpu" / "cartpole_swingup_s1"
    run_dir.mkdir(parents=True)
    rows = [
        {"split": "train", "step": 10_000, "train_time_s": 360.0},
        {"split": "eval", "step": 10_000, "avg_sum_reward": 300.0},
        {"split": "eval", "step": 10_000, "avg_sum_reward": 310.0},  # redone by a resumed run
        {"split": "train", "step": 20_000, "train_time_s": 1080.0},
        {"split": "eval", "step": 20_000, "avg_sum_reward": 863.1},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    outputs = {"RESULTS_FILE": "r.json", "PLOT_FILE": "steps.png", "HOURS_PLOT_FILE": "hours.png"}
    for attr, file in outputs.items():
        monkeypatch.setattr(reproduce_tdmpc, attr, tmp_path / file)
    assert not reproduce_tdmpc._finished(run_dir)
    reproduce_tdmpc.report(_args(tmp_path))
    run = json.loads((tmp_path / "r.json").read_text())["runs"]["cartpole_swingup_s1"]
    assert run["curve"] == [
        {"step": 10_000, "train_hours": 0.1, "avg_sum_reward": 310.0},
        {"step": 20_000, "train_hours": 0.3, "avg_sum_reward": 863.1},
    ]
    assert "| cartpole_swingup_s1 | 863.1 | 10k: 310, 20k: 863 | 0.30 | running |" in capsys.readouterr().out
    assert (tmp_path / "steps.png").stat().st_size > 0 and (tmp_path / "hours.png").stat().st_size > 0


def test_a_figure_matches_within_ten_percent_or_inside_the_seeds_spread():
    assert reproduce_tdmpc.verdict(800.0, 863.1, None) == "800.0 (0.93x): match"
    assert reproduce_tdmpc.verdict(740.0, 832.2, (734.1, 934.0)) == "740.0 (0.89x): match"
    assert reproduce_tdmpc.verdict(700.0, 832.2, (734.1, 934.0)) == "700.0 (0.84x): short"
    assert reproduce_tdmpc.verdict(100.0, 63.0, None) == "100.0 (1.59x): above"


def test_a_variant_trains_with_its_overrides_in_its_own_directory_and_report_files(
    tmp_path, monkeypatch, capsys
):
    args = _args(tmp_path, overrides=["training.per_alpha=0.6"], tag="per")
    cfg = compose_config(reproduce_tdmpc._command(args, "mw_push", 1)[2:])
    assert cfg.training.per_alpha == 0.6 and cfg.env.task == "push-v3"
    assert cfg.output_dir == str(tmp_path / "cpu-per" / "mw_push_s1")

    run_dir = tmp_path / "cpu-per" / "mw_push_s1"
    run_dir.mkdir(parents=True)
    rows = [{"split": "train", "step": 100_000, "train_time_s": 3600.0}]
    rows.append({"split": "eval", "step": 100_000, "pc_success": 60.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for attr, file in {
        "RESULTS_FILE": "r.json",
        "PLOT_FILE": "steps.png",
        "HOURS_PLOT_FILE": "hours.png",
    }.items():
        monkeypatch.setattr(reproduce_tdmpc, attr, tmp_path / file)
    reproduce_tdmpc.report(args)
    assert not (tmp_path / "r.json").exists()  # the recipes' report is left alone
    out = json.loads((tmp_path / "r_per.json").read_text())
    assert out["overrides"] == ["training.per_alpha=0.6"] and list(out["runs"]) == ["mw_push_s1"]
    assert (tmp_path / "steps_per.png").exists() and (tmp_path / "hours_per.png").exists()
    # TD-MPC's published success (mean of 3 seeds: 80, 20, 60) with TD-MPC2's beside it; 60 is in the seeds' spread.
    assert (
        "| mw_push_s1 | 53.3 (TD-MPC2: 63.3) | 100k: 60 | 1.00 | 60.0 (1.13x): match |"
        in capsys.readouterr().out
    )
