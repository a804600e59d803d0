"""`scripts/eval.py`'s output directory and its `eval.*` values: one evaluation per directory (a second one is
refused unless `--overwrite`), and every bad `eval.*` value stops it with one line before anything is written."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import env_config
from lerobot.evaluation import evaluate
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training.run_dir.saving import save_checkpoint

QUICK = ["policy=random", "env=pusht_keypoints", "env.max_episode_steps=5", "eval.n_episodes=2"]
QUICK += ["eval.batch_size=2", "eval.use_async_envs=false"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def seed_of(out: Path) -> int:
    return json.loads((out / "eval_info.json").read_text())["config"]["seed"]


def test_second_evaluation_into_one_output_dir_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "compare"
    assert eval_main([*QUICK, "seed=1", "eval.max_episodes_rendered=1", "--output-dir", str(out)]) == 0
    videos = sorted((out / "videos").iterdir())
    assert len(videos) == 1
    capsys.readouterr()
    # The issue: this one used to replace the first one's eval_info.json without a word.
    assert eval_main([*QUICK, "seed=2", "eval.max_episodes_rendered=0", "--output-dir", str(out)]) == 2
    err = one_line(capsys)
    assert f"{out} already holds an evaluation (eval_info.json and 1 file(s) in videos/)" in err, err
    assert "pick another --output-dir" in err and "--overwrite" in err, err
    assert seed_of(out) == 1 and sorted((out / "videos").iterdir()) == videos
    assert eval_main([*QUICK, "seed=2", "eval.max_episodes_rendered=0", f"output_dir={out}"]) == 2  # same key
    capsys.readouterr()
    # --overwrite replaces the whole evaluation: no video of the first one is left beside the second one.
    args = [*QUICK, "seed=2", "eval.max_episodes_rendered=0", "--output-dir", str(out), "--overwrite"]
    assert eval_main(args) == 0
    assert seed_of(out) == 2 and list(out.glob("videos/*")) == []


def test_output_dir_without_an_evaluation_is_used(tmp_path):
    """An existing directory holding no evaluation (an empty videos/ included) is fine, its other files kept."""
    (tmp_path / "videos").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    assert eval_main([*QUICK, "eval.max_episodes_rendered=0", "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "eval_info.json").is_file() and (tmp_path / "notes.txt").read_text() == "mine"


def test_default_output_dirs_started_in_the_same_second_differ(tmp_path, monkeypatch):
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2025, 1, 2, 3, 4, 5)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("lerobot.cli.eval.dt.datetime", Frozen)
    for seed in (1, 2):
        assert eval_main([*QUICK, f"seed={seed}", "eval.max_episodes_rendered=0"]) == 0
    base = tmp_path / "outputs/eval/2025-01-02"
    assert sorted(p.name for p in base.iterdir()) == [
        "03-04-05_pusht_keypoints_random",
        "03-04-05_pusht_keypoints_random_2",
    ]
    assert [seed_of(p) for p in sorted(base.iterdir())] == [1, 2]


def test_in_training_evaluation_writes_its_directory_again(tmp_path):
    """`evaluate` (what training runs into run_dir/eval/step_N/, and redoes after a resume) is not refused."""
    cfg = compose_config([*QUICK, "eval.max_episodes_rendered=0"])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    for _ in range(2):
        evaluate(cfg, policy, tmp_path / "eval" / "step_4")
    assert (tmp_path / "eval" / "step_4" / "eval_info.json").is_file()


# One bad value of every `eval.*` field (EvalConfig), and the key its message names.
BAD_EVAL_VALUES = [
    ("eval.n_episodes=0", "eval.n_episodes=0 must be a positive number"),
    ("eval.n_episodes=many", "eval.n_episodes"),
    ("eval.batch_size=-2", "eval.batch_size=-2 must be a positive number"),
    ("eval.use_async_envs=maybe", "eval.use_async_envs='maybe': expected auto, true or false"),
    ("eval.max_episodes_rendered=-1", "eval.max_episodes_rendered=-1 must be 0 or a positive number"),
    ("eval.start_seed=-3", "eval.start_seed=-3 must be 0 or a positive number"),
    ("eval.start_seed=1.5", "eval.start_seed"),
    ("eval.freq=-1", "eval.freq=-1 must be 0 or a positive number"),
    ("eval.step_timeout_s=0", "eval.step_timeout_s=0.0 must be a positive number or null"),
    ("eval.step_timeout_s=soon", "eval.step_timeout_s"),
    ("eval.schedule=sometimes", "eval.schedule='sometimes': expected one of"),
]


@pytest.mark.parametrize("override,message", BAD_EVAL_VALUES, ids=[o for o, _ in BAD_EVAL_VALUES])
def test_bad_eval_value_is_one_line_and_writes_nothing(override, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "e"
    assert eval_main([*QUICK, "eval.max_episodes_rendered=1", override, "--output-dir", str(out)]) == 2
    assert message in one_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no videos/, no output directory, no default one


def test_bad_eval_value_with_a_checkpoint_or_in_training_stops_at_start(tmp_path, capsys):
    cfg = compose_config(["policy=pusht_scripted", "env=pusht_keypoints"])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    save_checkpoint(tmp_path / "run", checkpoint_files(0, policy, cfg))
    args = ["--checkpoint", str(tmp_path / "run"), "eval.start_seed=-3", "--output-dir", str(tmp_path / "e")]
    assert eval_main(args) == 2
    assert "eval.start_seed=-3 must be 0 or a positive number" in one_line(capsys)
    assert not (tmp_path / "e").exists()
    assert (
        train_main(
            ["policy=diffusion", "env=pusht_keypoints", "eval.start_seed=-1", f"output_dir={tmp_path / 't'}"]
        )
        == 2
    )
    assert "eval.start_seed=-1" in one_line(capsys) and not (tmp_path / "t").exists()
