import importlib.util
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("plot_runs", REPO_ROOT / "scripts" / "plot_runs.py")
plot_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_runs)


def write_run(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_training_hours_leave_out_evaluation_and_stops():
    records = [
        {"step": 100, "split": "train", "time": 0.0},
        {"step": 200, "split": "train", "time": 360.0},
        {"step": 200, "split": "eval", "time": 460.0, "eval_s": 90.0},  # 10 s of training, 90 of eval
        {"step": 300, "split": "train", "time": 820.0},
        {"step": 400, "split": "train", "time": 50_000.0},  # stopped, resumed the next day
        {"step": 500, "split": "train", "time": 50_360.0},
    ]
    hours = plot_runs.training_hours(records, gap_s=1800)
    assert hours == pytest.approx([0.0, 0.1, 370 / 3600, 730 / 3600, 730 / 3600, 1090 / 3600])


def test_plot_writes_a_png_and_names_a_run_without_evaluations(tmp_path):
    evaluated = write_run(
        tmp_path / "a",
        [
            {"step": 10, "split": "train", "time": 0.0},
            {
                "step": 10,
                "split": "eval",
                "time": 5.0,
                "eval_s": 4.0,
                "avg_max_reward": 0.5,
                "pc_success": 10.0,
            },
            {
                "step": 20,
                "split": "eval",
                "time": 9.0,
                "eval_s": 1.0,
                "avg_max_reward": 0.7,
                "pc_success": 20.0,
                "avg_max_reward_ci95_low": 0.6,
                "avg_max_reward_ci95_high": 0.8,
                "pc_success_ci95_low": 10.0,
                "pc_success_ci95_high": 30.0,
            },
        ],
    )
    out = tmp_path / "curves" / "runs.png"
    plot_runs.main([f"{evaluated}:DP", "--out", str(out), "--x", "steps"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    silent = write_run(tmp_path / "b", [{"step": 10, "split": "train", "time": 0.0}])
    with pytest.raises(SystemExit, match="holds no evaluation yet"):
        plot_runs.main([str(silent), "--out", str(out)])
    with pytest.raises(SystemExit, match="not found"):
        plot_runs.main([str(tmp_path / "missing"), "--out", str(out)])
