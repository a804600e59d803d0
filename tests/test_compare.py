"""Paired comparison of evaluations (`lerobot.compare`, `scripts/compare_evals.py`)."""

import importlib.util
import json
from pathlib import Path

import pytest

from lerobot.compare import paired_difference

REPO_ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_evals", REPO_ROOT / "scripts" / "compare_evals.py")
compare_evals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_evals)


def _write_eval(directory: Path, seeds, max_rewards, successes) -> Path:
    directory.mkdir(parents=True)
    rows = [
        {"episode_ix": i, "seed": s, "sum_reward": 0.0, "max_reward": m, "success": bool(k), "n_steps": 10}
        for i, (s, m, k) in enumerate(zip(seeds, max_rewards, successes, strict=True))
    ]
    (directory / "eval_info.json").write_text(json.dumps({"per_episode": rows, "aggregated": {}}))
    return directory


def test_paired_difference_matches_seeds_and_gives_paired_intervals(tmp_path):
    base = _write_eval(tmp_path / "base", [10, 11, 12, 13], [0.5, 0.6, 0.7, 0.8], [0, 0, 1, 1])
    # `other` lists its episodes in another order and has one seed `base` lacks: pairs go by seed.
    other = _write_eval(tmp_path / "other", [13, 12, 11, 10, 99], [0.8, 0.9, 0.7, 0.6, 1.0], [1, 1, 1, 0, 1])
    r = paired_difference([(base, other / "eval_info.json")])
    assert r["n_pairs"] == 4
    # differences 0.1, 0.1, 0.2, 0.0: mean 0.1, sample sd 0.08165, half-width 1.96 * sd / 2
    assert r["delta_avg_max_reward"] == pytest.approx(0.1)
    assert r["delta_avg_max_reward_ci_high"] - r["delta_avg_max_reward"] == pytest.approx(0.080017, rel=1e-4)
    assert r["base_avg_max_reward"] == pytest.approx(0.65) and r["other_avg_max_reward"] == pytest.approx(
        0.75
    )
    # success differences 0, 1, 0, 0 (seed 11 newly succeeds): +25 points
    assert r["delta_pc_success"] == pytest.approx(25.0)
    assert r["delta_pc_success_ci_low"] < 0 < r["delta_pc_success_ci_high"]


def test_pairs_pool_and_a_shift_on_every_episode_has_a_zero_width_interval(tmp_path):
    seeds = list(range(5))
    a1 = _write_eval(tmp_path / "a1", seeds, [0.1, 0.2, 0.3, 0.4, 0.5], [0] * 5)
    b1 = _write_eval(tmp_path / "b1", seeds, [0.2, 0.3, 0.4, 0.5, 0.6], [0] * 5)
    a2 = _write_eval(tmp_path / "a2", seeds, [0.5] * 5, [1] * 5)
    b2 = _write_eval(tmp_path / "b2", seeds, [0.6] * 5, [1] * 5)
    r = paired_difference([(a1, b1), (a2, b2)])
    assert r["n_pairs"] == 10
    assert r["delta_avg_max_reward"] == pytest.approx(0.1)
    assert r["delta_avg_max_reward_ci_low"] == pytest.approx(0.1)
    assert r["delta_pc_success"] == 0.0


def test_bad_inputs_get_one_clear_error(tmp_path, capsys):
    a = _write_eval(tmp_path / "a", [1, 2], [0.1, 0.2], [0, 0])
    b = _write_eval(tmp_path / "b", [3, 4], [0.1, 0.2], [0, 0])
    with pytest.raises(ValueError, match="share no episode seed"):
        paired_difference([(a, b)])
    with pytest.raises(FileNotFoundError, match="no evaluation at"):
        paired_difference([(a, tmp_path / "missing")])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not an evaluation"):
        paired_difference([(a, tmp_path / "bad.json")])
    with pytest.raises(SystemExit):
        compare_evals.main([str(a)])
    assert "pairs" in capsys.readouterr().err


def test_script_prints_the_paired_figures(tmp_path, capsys):
    a = _write_eval(tmp_path / "a", [1, 2, 3], [0.1, 0.2, 0.3], [0, 0, 0])
    b = _write_eval(tmp_path / "b", [1, 2, 3], [0.3, 0.4, 0.5], [1, 0, 0])
    compare_evals.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert "3 paired episodes" in out
    assert "other - base +0.200" in out
    assert "other - base +33.3" in out
