"""A run directory's life: stop signals sent to real `scripts/train.py` processes, automatic resume, the
one-writer lock, a metrics file cut by a kill, and start-up checks of training values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_dataset import ZARR, write_fake_zarr
from test_online_train import TINY as TINY_TDMPC
from test_train import TINY

from lerobot.checkpoints.run import load_training_state
from lerobot.checkpoints.run_layout import latest_checkpoint
from lerobot.cli import train_main
from lerobot.training.run_dir.lock import LOCK_FILE, RunLock

REPO_ROOT = Path(__file__).resolve().parents[1]
# Far more steps than a test waits for: these runs end by a signal.
ENDLESS = ["training.steps=1000000", "training.save_freq=100000", "eval.freq=0"]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def diffusion_args(data_args: list[str], run: Path) -> list[str]:
    return [*TINY, "env=pusht_keypoints", *data_args, f"output_dir={run}"]


def launch(args: list[str], prelude: str = "") -> subprocess.Popen:
    """`scripts/train.py args` in a new process (`prelude`: Python run before it, e.g. a slowed-down save)."""
    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['train.py', *{args!r}]\nrunpy.run_path('scripts/train.py', run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, which the signals go to (workers included)
    )


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"training exited early ({proc.returncode}): {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("training did not get there in time")
        time.sleep(0.05)


def train_steps(run: Path, split: str = "train") -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.endswith("}")]
    return [r["step"] for r in map(json.loads, lines) if r["split"] == split]


def stop(proc: subprocess.Popen, *signums: int) -> tuple[int, str, float]:
    """Send the signals (0.2 s apart) to the run's process group, as a terminal's Ctrl-C or a scheduler does;
    return the exit code, stderr and seconds from the first signal to the exit."""
    t0 = time.monotonic()
    for i, signum in enumerate(signums):
        if i:
            time.sleep(0.2)
        os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, time.monotonic() - t0


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def no_temp_dirs(run: Path) -> bool:
    return not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_sigterm_saves_and_exits_0_then_relaunch_resumes(tmp_path, data_args, capsys):
    run = tmp_path / "run"
    args = diffusion_args(data_args, run)
    proc = launch([*args, *ENDLESS, "training.num_workers=1"])  # the worker gets the SIGTERM too
    wait_for(lambda: len(train_steps(run)) >= 3, proc)

    # One writer per run directory: a second launch (this process) stops at once, naming the owner.
    assert train_main([*args, *ENDLESS]) == 2
    err = capsys.readouterr().err.strip()
    assert f"pid={proc.pid}" in err and "in use" in err and len(err.splitlines()) == 1, err

    seen = train_steps(run)[-1]
    code, err, seconds = stop(proc, signal.SIGTERM)
    assert code == 0 and seconds < 30, (code, seconds, err[-2000:])
    assert "Traceback" not in err
    stopped = int(last_line(err).split(" at step ")[1].split(",")[0])
    assert last_line(err).startswith("stopped by SIGTERM") and stopped >= seen
    assert latest_checkpoint(run).name == f"{stopped:09d}" and no_temp_dirs(run)
    assert load_training_state(latest_checkpoint(run))["step"] == stopped
    assert train_steps(run)[-1] == stopped  # the stop step is logged too
    assert (run / LOCK_FILE).read_text() == ""  # released on the way out

    # Relaunching (with a longer budget, a change a resume allows) continues the run from its checkpoint.
    assert train_main([*args, f"training.steps={stopped + 2}", "eval.freq=0"]) == 0
    assert train_steps(run) == list(range(1, stopped + 3))
    # ... but not with another model.
    capsys.readouterr()
    assert train_main([*args, f"training.steps={stopped + 4}", "eval.freq=0", "policy.n_groups=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another config" in err and "policy.n_groups (4 -> 2)" in err and len(err.splitlines()) == 1, err


# A save writes its training state slowly and says when it starts, so that a signal lands inside a save.
SLOW_SAVE = textwrap.dedent(
    """
    import pathlib, time, torch
    real_save = torch.save
    def slow_save(obj, f, *a, **k):
        path = pathlib.Path(getattr(f, "name", str(f)))
        if path.parent.name.startswith(".tmp-"):  # a checkpoint's temporary directory
            path.parents[2].joinpath("saving").write_text(path.parent.name)
            time.sleep(1.0)
        return real_save(obj, f, *a, **k)
    torch.save = slow_save
    """
)


@pytest.mark.parametrize("ctrl_c", [1, 2], ids=["once", "twice"])
def test_ctrl_c_during_a_save(tmp_path, data_args, ctrl_c):
    """Once: the save finishes, the next step saves, exit 130 with one line. Twice: the second aborts the
    stop's save at once; either way no temporary directory is left and `last` is a whole checkpoint."""
    run = tmp_path / "run"
    proc = launch([*diffusion_args(data_args, run), *ENDLESS, "training.save_freq=3"], prelude=SLOW_SAVE)
    wait_for(lambda: (run / "saving").exists(), proc)  # inside the save of step 3
    if ctrl_c == 2:
        os.killpg(proc.pid, signal.SIGINT)
        wait_for(lambda: (run / "saving").read_text().startswith(".tmp-000000004"), proc)
    code, err, seconds = stop(proc, signal.SIGINT)
    assert code == 130 and seconds < 30 and "Traceback" not in err, (code, err[-2000:])
    assert no_temp_dirs(run)
    if ctrl_c == 1:
        assert last_line(err).startswith("stopped by SIGINT at step 4")
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000003", "000000004", "last"]
    else:
        assert last_line(err).startswith("stopped by SIGINT without saving")
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000003", "last"]
    weights = load_file(latest_checkpoint(run) / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_online_sigusr1_saves_and_exits_0(tmp_path):
    run = tmp_path / "run"
    proc = launch([*TINY_TDMPC, *ENDLESS, f"output_dir={run}"])
    wait_for(lambda: len(train_steps(run)) >= 2, proc)  # past learning_starts: updates are running
    code, err, seconds = stop(proc, signal.SIGUSR1)
    assert code == 0 and seconds < 30 and "Traceback" not in err, (code, err[-2000:])
    stopped = int(last_line(err).split(" at step ")[1].split(",")[0])
    state = load_training_state(latest_checkpoint(run))
    assert state["transitions"] == stopped and stopped % 2 == 0 and "replay_buffer" not in state
    assert no_temp_dirs(run)


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    code = f"from lerobot.training.run_dir.lock import RunLock; RunLock({str(tmp_path)!r}).acquire(); print('locked', flush=True); input()"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    from lerobot.errors import RunDirError

    with pytest.raises(RunDirError, match=f"pid={holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.kill()  # SIGKILL: no clean-up, the file still names the dead owner
    holder.wait()
    assert f"pid={holder.pid}" in (tmp_path / LOCK_FILE).read_text()
    lock = RunLock(tmp_path)
    with caplog.at_level("WARNING"):
        lock.acquire()
    assert f"taking over the lock left by a run that has ended (pid={holder.pid}" in caplog.text
    assert (tmp_path / LOCK_FILE).read_text().startswith(f"pid={os.getpid()} ")
    lock.release()


def test_eval_cut_by_a_kill_is_redone_and_a_half_written_line_dropped(tmp_path, data_args, caplog):
    run = tmp_path / "run"
    args = [*diffusion_args(data_args, run), "training.steps=4", "training.save_freq=2", "eval.freq=2"]
    assert train_main(args) == 0
    path = run / "metrics.jsonl"
    text = path.read_text()
    assert text.splitlines()[-1].startswith('{"step": 4, "split": "eval"')
    evals = {r["step"]: r for r in map(json.loads, text.splitlines()) if r["split"] == "eval"}
    # Killed while appending the step-4 evaluation: its line is cut in the middle.
    cut = len(text) - len(text.splitlines()[-1]) // 2
    path.write_bytes(text.encode()[:cut])
    (run / LOCK_FILE).write_text("pid=1 host=elsewhere\n")

    with caplog.at_level("WARNING"):
        assert train_main(args) == 0  # the same command: resumes at step 4, the run's end
    assert "dropped 1 unreadable line(s) (line 6)" in caplog.text
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in records] == [
        (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (4, "train"), (4, "eval"),
    ]  # fmt: skip
    # The redone evaluation is the one the killed run was doing: same weights, same random state (to the
    # float rounding of the CPU's kernels, which may differ for weights loaded at other addresses).
    for key in ("avg_max_reward", "avg_sum_reward", "pc_success"):
        assert records[-1][key] == pytest.approx(evals[4][key], rel=1e-6)


def test_resume_modes(tmp_path, data_args, capsys):
    run = tmp_path / "run"
    args = [*diffusion_args(data_args, run), "training.steps=2", "eval.freq=0"]
    assert train_main([*args, "training.resume=true"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert train_main(args) == 0  # auto: a new run
    assert train_main([*args, "training.resume=false"]) == 2
    assert "training.resume=false" in capsys.readouterr().err
    # A run killed before its first checkpoint: the relaunch starts over and forgets its metrics.
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 9.0}\n{"step": 2, "spl')
    for p in (run / "checkpoints").iterdir():
        p.unlink() if p.is_symlink() else __import__("shutil").rmtree(p)
    assert train_main(args) == 0
    assert train_steps(run) == [1, 2]
    assert train_main([*args, "training.steps=3", "training.resume=true", "eval.n_episodes=3"]) == 0
    assert train_steps(run) == [1, 2, 3]


@pytest.mark.parametrize(
    "override,message",
    [
        ("training.batch_size=0", "training.batch_size=0 must be a positive number"),
        ("training.batch_size=-4", "training.batch_size=-4"),
        ("policy.optimizer_lr=-0.001", "policy.optimizer_lr=-0.001 must be a positive number"),
        ("training.save_freq=0", "training.save_freq=0 must be a positive number"),
        ("training.log_freq=0", "training.log_freq=0 must be a positive number"),
        ("training.steps=0", "training.steps=0 must be a positive number"),
        ("training.num_workers=-1", "training.num_workers=-1 must be 0 or a positive number"),
        ("training.resume=maybe", "training.resume='maybe': expected auto, true or false"),
        ("policy.scheduler_step_rules='1:10,0.1'", "step rules go with scheduler_name=piecewise_constant"),
        ("policy.scheduler_name=piecewise_constant", "step rules go with scheduler_name=piecewise_constant"),
        ("policy.scheduler_step_rules='1:10,0.1:5,0.01'", "expected 'factor:update,...,factor'"),
    ],
)
def test_bad_training_values_stop_at_start(override, message, tmp_path, capsys):
    assert train_main(["policy=diffusion", "env=pusht_keypoints", override, f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.iterdir())  # nothing written
