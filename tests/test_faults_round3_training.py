"""Round three of faults in training runs, each with a real fault: the printed resume command of a run in a
timestamped directory (a real SIGINT, then that command run and stopped by a real SIGTERM), a file where a
checkpoint directory was, checkpoint pruning (`training.keep_checkpoints`), a SIGTERM during an in-training
evaluation, a start that fails before training, a resume under another env, and a Ctrl-C during the data
conversion."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_checkpoint_faults import KEYPOINTS, one_line_error, tiny_checkpoint
from test_dataset import ZARR, write_fake_zarr
from test_run_lifecycle import ENDLESS, last_line, launch, stop, train_steps, wait_for
from test_train import TINY, TINY_IMAGE

from lerobot.checkpoints.run_layout import checkpoint_dir, latest_checkpoint
from lerobot.cli import train_main
from lerobot.training.run_dir.lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def checkpoint_names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def eval_steps(run: Path) -> list[int]:
    return train_steps(run, split="eval")


# ------------------------------------------------- the stop line's command resumes a timestamped run
def test_the_stop_line_names_the_command_that_resumes_a_timestamped_run(tmp_path, data_args):
    """Without `output_dir` every launch gets a new timestamped directory, so "run the same command again"
    started a new run; the stop line now prints the command with `output_dir=` that resumes this one."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [*KEYPOINTS, *data_args, *ENDLESS]
    first = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "train.py"), *args],
        cwd=tmp_path,  # the default output_dir, outputs/train/<date>/<time>_<env>_<policy>, lands here
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    runs = lambda: list((tmp_path / "outputs" / "train").glob("*/*"))  # noqa: E731
    wait_for(lambda: len(runs()) == 1 and len(train_steps(runs()[0])) >= 2, first)
    code, err, _ = stop(first, signal.SIGINT)
    line = last_line(err)
    assert code == 130 and line.startswith("stopped by SIGINT at step "), err[-2000:]
    stopped = int(line.split(" at step ")[1].split(",")[0])
    run = runs()[0]
    command = shlex.split(line.split("; resume with: ")[1])
    assert command[:2] == ["python", str(REPO / "scripts" / "train.py")]
    assert command[2:] == [*args, f"output_dir={run.relative_to(tmp_path)}"]

    second = subprocess.Popen(
        [sys.executable, *command[1:]],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(lambda: train_steps(run)[-1] > stopped, second)
    code, err, _ = stop(second, signal.SIGTERM)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    # The relative output_dir is the run it resumes, not "a new run from" its own checkpoint.
    assert f"run directory: {run.relative_to(tmp_path)} (resuming from {stopped:09d})" in err
    assert runs() == [run]  # no second timestamped directory
    steps = train_steps(run)
    assert steps == list(range(1, steps[-1] + 1))  # one trajectory through the stop


# ------------------------------------------------------------ a file where a checkpoint directory was
def test_a_file_in_place_of_a_checkpoint_is_set_aside_and_no_step_is_lost(tmp_path, data_args, caplog):
    """Resuming went on from the earlier checkpoint, then crashed at the save of the replaced step
    (NotADirectoryError), losing every step since; the file is now renamed aside at start-up, kept."""
    run = tmp_path / "run"
    args = [*KEYPOINTS, *data_args, "training.save_freq=2", "eval.freq=0", f"output_dir={run}"]
    assert train_main([*args, "training.steps=4"]) == 0
    replaced = checkpoint_dir(run, 4)
    for path in replaced.iterdir():
        path.unlink()
    replaced.rmdir()
    replaced.write_text("not a checkpoint")

    with caplog.at_level("WARNING"):
        assert train_main([*args, "training.steps=6"]) == 0
    assert f"{replaced} is not a checkpoint directory" in caplog.text
    assert checkpoint_names(run) == [
        "000000002",
        "000000004",
        "000000004.not-a-checkpoint",
        "000000006",
        "last",
    ]
    assert (run / "checkpoints" / "000000004.not-a-checkpoint").read_text() == "not a checkpoint"
    assert latest_checkpoint(run) == checkpoint_dir(run, 6).resolve()
    assert train_steps(run) == [1, 2, 3, 4, 5, 6]  # resumed at 2: steps 3 and 4 again, then on


def test_a_save_puts_a_file_at_its_place_aside(tmp_path, caplog):
    """A file that appears where a checkpoint is about to be saved (during training) is kept under another
    name, and the checkpoint is written."""
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    (run / "checkpoints" / "000000002").write_text("mine")
    with caplog.at_level("WARNING"):
        saved = tiny_checkpoint(run, 2)
    assert saved.is_dir() and latest_checkpoint(run) == saved.resolve()
    assert (run / "checkpoints" / "000000002.not-a-checkpoint").read_text() == "mine"
    assert "was not a checkpoint directory" in caplog.text


# ------------------------------------------------------------------------ training.keep_checkpoints
@pytest.mark.parametrize(
    "keep,kept",
    [
        (None, ["000000003", "000000004", "000000005", "last"]),  # the default: 3
        ("2", ["000000004", "000000005", "last"]),
        ("null", [f"{s:09d}" for s in range(1, 6)] + ["last"]),
    ],
)
def test_keep_checkpoints_deletes_the_oldest(tmp_path, data_args, keep, kept):
    run = tmp_path / "run"
    args = [*KEYPOINTS, *data_args, "training.steps=5", "training.save_freq=1", "eval.freq=0"]
    extra = [] if keep is None else [f"training.keep_checkpoints={keep}"]
    assert train_main([*args, *extra, f"output_dir={run}"]) == 0
    assert checkpoint_names(run) == kept
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # nothing half-deleted


def test_keep_checkpoints_keeps_the_fallback_of_a_diverged_run(tmp_path, data_args, monkeypatch, capsys):
    """With one checkpoint kept, the one before the newest stays until the newest is known good: when the
    newest one's weights give a NaN loss, `last` goes back to it."""
    from lerobot.policies.diffusion.modeling import DiffusionPolicy

    real_forward = DiffusionPolicy.forward
    calls = {"n": 0}

    def nan_on_fifth(self, batch):
        calls["n"] += 1
        out = real_forward(self, batch)
        if calls["n"] == 5:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(DiffusionPolicy, "forward", nan_on_fifth)
    run = tmp_path / "run"
    args = [*KEYPOINTS, *data_args, "training.steps=6", "training.save_freq=2", "eval.freq=0"]
    assert train_main([*args, "training.keep_checkpoints=1", f"output_dir={run}"]) == 2
    err = one_line_error(capsys)
    assert "step 5" in err and "checkpoints/last now points at the last good checkpoint" in err
    assert checkpoint_names(run) == ["000000002", "000000004", "last"]
    assert latest_checkpoint(run) == checkpoint_dir(run, 2).resolve()


@pytest.mark.parametrize("value", ["0", "-2"])
def test_keep_checkpoints_is_checked_at_start_up(tmp_path, value, capsys):
    run = tmp_path / "run"
    assert train_main([*KEYPOINTS, f"training.keep_checkpoints={value}", f"output_dir={run}"]) == 2
    err = one_line_error(capsys)
    assert f"training.keep_checkpoints={value} must be a positive number (or null to keep every" in err
    assert not run.exists()


# ------------------------------------------------------------- a SIGTERM during an in-training evaluation
# The in-training evaluation writes a partial file into its directory, says so, and takes its time before
# evaluating, so that a signal lands inside it.
SLOW_EVAL = textwrap.dedent(
    """
    import pathlib, time
    import lerobot.training.progress as progress
    real_evaluate = progress.evaluate
    def slow_evaluate(cfg, policy, out_dir, *a, **k):
        out_dir = pathlib.Path(out_dir)
        (out_dir / "videos").mkdir(parents=True, exist_ok=True)
        (out_dir / "videos" / ".episode_0.tmp.mp4").write_bytes(b"partial")
        out_dir.parents[1].joinpath("evaluating").write_text(out_dir.name)
        time.sleep(60)
        return real_evaluate(cfg, policy, out_dir, *a, **k)
    progress.evaluate = slow_evaluate
    """
)


def test_sigterm_during_an_evaluation_stops_at_its_step_and_the_resume_redoes_it(tmp_path, data_args):
    """The evaluation used to be dropped for good (the run stopped a step later, so the resume never
    redid it) and its partial `eval/step_N/` stayed."""
    run = tmp_path / "run"
    args = [*KEYPOINTS, *data_args, "training.steps=4", "training.save_freq=100", "eval.freq=2"]
    proc = launch([*args, f"output_dir={run}"], prelude=SLOW_EVAL)
    wait_for(lambda: (run / "evaluating").exists(), proc)
    code, err, _ = stop(proc, signal.SIGTERM)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    assert last_line(err).startswith(
        f"stopped by SIGTERM at step 2, checkpoint {checkpoint_dir(run, 2).resolve()};"
    )
    assert "evaluation at step 2 abandoned for SIGTERM" in err
    assert checkpoint_names(run) == ["000000002", "last"]  # this step's checkpoint, though none was due
    assert not (run / "eval" / "step_000000002").exists()
    assert eval_steps(run) == []

    assert train_main([*args, f"output_dir={run}"]) == 0  # the same command, without the slow evaluation
    assert eval_steps(run) == [2, 4]
    assert train_steps(run) == [1, 2, 3, 4]
    info = json.loads((run / "eval" / "step_000000002" / "eval_info.json").read_text())
    assert len(info["per_episode"]) == 2
    assert not list((run / "eval").rglob("*.tmp.mp4"))


# -------------------------------------------------------------------------------- a start that fails
def test_a_start_that_fails_before_training_leaves_no_directory(tmp_path, monkeypatch, capsys):
    """No data: the launch stops with one line; the timestamped run directory it made (holding only
    `run.lock`) and its parents are gone again. An output_dir that existed before stays, without a lock file."""
    monkeypatch.chdir(tmp_path)
    missing = [f"dataset.root={tmp_path / 'nowhere'}", f"dataset.cache_dir={tmp_path / 'cache'}"]
    assert train_main([*KEYPOINTS, *missing]) == 2
    assert "nowhere" in one_line_error(capsys)
    assert not (tmp_path / "outputs").exists()

    given = tmp_path / "mine"
    given.mkdir()
    assert train_main([*KEYPOINTS, *missing, f"output_dir={given}"]) == 2
    one_line_error(capsys)
    assert given.is_dir() and list(given.iterdir()) == []
    # A run directory that holds a run keeps everything when a relaunch fails before training, and gets no
    # lock file from the failed launch.
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    assert train_main([*KEYPOINTS, *missing, f"output_dir={run}"]) == 2
    one_line_error(capsys)
    assert checkpoint_names(run) == ["000000001", "last"] and not (run / LOCK_FILE).exists()


# ------------------------------------------------------------------------------- resuming another env
def test_resuming_under_another_env_says_the_env_changed(tmp_path, capsys):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)  # trained on pusht_keypoints
    assert train_main([*TINY, *TINY_IMAGE, f"output_dir={run}"]) == 2
    err = one_line_error(capsys)
    assert f"{run} holds a run with another config: env changed: pusht_keypoints -> pusht" in err, err
    assert "features" not in err and "gym_kwargs" not in err and "observation_keys" not in err, err
    assert "relaunch with the run's settings to resume it" in err
    assert len(err) < 400, err


# ---------------------------------------------------------------------------- Ctrl-C during conversion
# The conversion of the data says it started and takes its time, so that a Ctrl-C lands inside it.
SLOW_IMPORT = textwrap.dedent(
    """
    import pathlib, sys, time
    import lerobot.training.offline as offline
    real_import = offline.import_dataset
    def slow_import(cfg, *a, **k):
        pathlib.Path(sys.argv[-1].split("=", 1)[1] + ".converting").write_text("")
        time.sleep(60)
        return real_import(cfg, *a, **k)
    offline.import_dataset = slow_import
    """
)


@pytest.mark.parametrize("earlier", [False, True], ids=["new-run", "with-checkpoint"])
def test_ctrl_c_during_the_data_conversion_says_what_a_relaunch_does(tmp_path, earlier):
    run = tmp_path / "run"
    if earlier:
        tiny_checkpoint(run, 1)
    data = [f"dataset.root={tmp_path / 'root'}", f"dataset.cache_dir={tmp_path / 'cache'}"]
    write_fake_zarr(tmp_path / "root" / ZARR, lengths=[20, 25])
    args = [*KEYPOINTS, *data, f"output_dir={run}"]
    proc = launch(args, prelude=SLOW_IMPORT)
    wait_for(lambda: Path(f"{run}.converting").exists(), proc)
    code, err, _ = stop(proc, signal.SIGINT)
    assert code == 130 and "Traceback" not in err, err[-2000:]
    line = last_line(err)
    if earlier:
        assert line.startswith("stopped by SIGINT without saving (resume from checkpoint 000000001 with: ")
        assert line.endswith(f"output_dir={run})")
        assert checkpoint_names(run) == ["000000001", "last"]
    else:
        assert (
            line
            == "stopped by SIGINT without saving (no checkpoint was saved: run the command again to start over)"
        )
        assert not run.exists()  # the failed start's directory is gone
