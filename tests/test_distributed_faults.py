"""Faults of a run on 2 processes under a real `torchrun` (gloo on the CPU), with real signals: an env worker
of rank 1 killed during a sharded evaluation, rank 1 stopped (SIGSTOP) during training and during a sharded
evaluation, SIGTERM to torchrun itself and SIGTERM to rank 1 alone.

torchrun starts this file as each rank's program (see `_rank_main` at the bottom): it runs the command line's
`train_main` or `eval_main` and records the rank's exit code in a file, since torchrun reports its workers'
codes only when one fails. It also holds the test's only hooks: killing one of rank 1's env workers once the
evaluation runs, and a shorter `distributed.LONG_TIMEOUT` (the wait of an evaluation's merge).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The test's hooks, read by `_rank_main`: the rank that kills one of its env workers, and the evaluation's
# wait (seconds) in place of `distributed.LONG_TIMEOUT`.
KILL_ENV_WORKER_ENV = "LEROBOT_TEST_KILL_ENV_WORKER_OF_RANK"
LONG_TIMEOUT_ENV = "LEROBOT_TEST_LONG_TIMEOUT_S"
# A sharded evaluation on async envs, 2 per process (a random policy's episode of 300 steps: about 0.3 s).
EVAL = [
    "policy=random",
    "env=pusht_keypoints",
    "eval.batch_size=2",
    "eval.use_async_envs=true",
    "eval.max_episodes_rendered=0",
]
# Training that a test ends; its first checkpoint is at step 100, the next one far away.
ENDLESS = ["training.steps=1000000", "training.save_freq=100", "eval.freq=0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(
    kind: str, args: list[str], rc_dir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`torchrun --nproc_per_node 2` running `kind` ("train" or "eval") with `args` on each rank."""
    rc_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        __file__,
        str(rc_dir),
        kind,
        *args,
    ]
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _children(pid: int) -> list[int]:
    """The pids of the direct children of `pid`."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return kids


def _rank_pid(torchrun: subprocess.Popen, rank: int) -> int:
    """The pid of the worker process of `rank` (a child of torchrun with RANK=`rank`)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pid in _children(torchrun.pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if f"RANK={rank}".encode() in environ:
                return pid
        time.sleep(0.1)
    raise AssertionError(f"no rank {rank} process under torchrun")


def _wait_for(condition, torchrun: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if torchrun.poll() is not None:
            raise AssertionError(
                f"torchrun exited early ({torchrun.returncode}): {torchrun.communicate()[1][-3000:]}"
            )
        if time.monotonic() > deadline:
            torchrun.kill()
            raise AssertionError("the run did not get there in time")
        time.sleep(0.05)


def _finish(torchrun: subprocess.Popen, timeout: float = 120.0) -> str:
    """torchrun's stderr once it has exited."""
    try:
        return torchrun.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        torchrun.kill()
        raise


def _exit_codes(rc_dir: Path) -> dict[int, int | None]:
    """Each rank's exit code as it recorded it (None: it recorded none, e.g. killed by a signal)."""
    paths = {rank: rc_dir / f"rank{rank}" for rank in range(2)}
    return {rank: int(path.read_text()) if path.exists() else None for rank, path in paths.items()}


def _error_lines(err: str) -> list[str]:
    """The `error: ...` lines of the processes; one may follow another's progress bar on the same line."""
    return re.findall(r"error: [^\r\n]*", err)


def _no_project_traceback(err: str) -> bool:
    """No traceback through the project's code (torchrun prints its own when a worker fails)."""
    return f'File "{REPO_ROOT / "lerobot"}' not in err


def _train_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.endswith("}")]
    return [r["step"] for r in map(json.loads, lines) if r["split"] == "train"]


def _diffusion_args(tmp_path: Path, run: Path) -> list[str]:
    from test_dataset import ZARR, write_fake_zarr
    from test_train import TINY

    root = tmp_path / "data"
    write_fake_zarr(root / ZARR, lengths=[20, 25, 18, 30])
    data = [f"dataset.root={root}", f"dataset.cache_dir={tmp_path / 'cache'}"]
    return [*TINY, "env=pusht_keypoints", *data, f"output_dir={run}", *ENDLESS]


def test_an_env_worker_dying_on_rank_1_ends_every_rank_with_one_line(tmp_path):
    # Rank 1 kills one of its own env workers (SIGKILL) as soon as its envs are up; rank 0 is still running
    # its episodes (torchrun then sends it SIGTERM) or waits to merge them (its collective fails).
    args = [*EVAL, "eval.n_episodes=8", "--output-dir", str(tmp_path / "eval")]
    torchrun = _torchrun("eval", args, tmp_path / "rc", {KILL_ENV_WORKER_ENV: "1"})
    err = _finish(torchrun, timeout=300)
    assert _exit_codes(tmp_path / "rc") == {0: 2, 1: 2}, err[-3000:]
    assert torchrun.returncode == 1  # torchrun's own code when a worker fails
    lines = _error_lines(err)
    assert len(lines) == 2, err[-3000:]
    own, peer = sorted(lines, key=lambda line: not line.startswith("error: rank 1:"))
    assert own.startswith("error: rank 1: env worker ") and "died" in own, err[-3000:]
    assert peer == f"error: rank 0: stopped because rank 1 failed: {own.removeprefix('error: rank 1: ')}"
    assert _no_project_traceback(err), err[-3000:]


def test_a_stopped_rank_ends_training_with_one_line_naming_it(tmp_path):
    from lerobot.checkpoints.run import load_training_state, read_weights
    from lerobot.checkpoints.run_layout import latest_checkpoint

    run = tmp_path / "run"
    args = [*_diffusion_args(tmp_path, run), "training.collective_timeout_s=3"]
    torchrun = _torchrun("train", args, tmp_path / "rc")
    # Past the checkpoint of step 100, far from the next one: the steps here wait 3 s for each other.
    _wait_for(lambda: len(_train_steps(run)) >= 102, torchrun)
    rank1 = _rank_pid(torchrun, 1)
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        _wait_for(lambda: (tmp_path / "rc/rank0").exists(), torchrun, timeout=60)
        seconds = time.monotonic() - stopped
    finally:
        os.kill(rank1, signal.SIGCONT)  # it finds the others gone, says so and ends too
    err = _finish(torchrun)
    # The timeout, up to REPORT_WAIT_S waiting for a word from rank 1, the way out; on a loaded machine.
    assert seconds < 3 + 10 + 20, seconds
    assert _exit_codes(tmp_path / "rc") == {0: 2, 1: 2}, err[-3000:]
    timeout = "did not answer within 3 s (training.collective_timeout_s)"
    assert sorted(_error_lines(err)) == [
        f"error: rank 0: stopped because rank 1 {timeout}",
        f"error: rank 1: stopped because rank 0 gave up waiting for this process: it {timeout}",
    ], err[-3000:]
    assert _no_project_traceback(err), err[-3000:]
    # The checkpoint before is whole and verifies.
    ckpt = latest_checkpoint(run)
    assert ckpt.name == "000000100" and load_training_state(ckpt)["step"] == 100
    read_weights(ckpt)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_stopped_rank_ends_a_sharded_evaluation_with_one_line_naming_it(tmp_path):
    # The merge of the episodes waits LONG_TIMEOUT (30 min) for the slowest process; 5 s here. Each process
    # has 20 episodes to run: some seconds.
    args = [*EVAL, "eval.n_episodes=40", "--output-dir", str(tmp_path / "eval")]
    torchrun = _torchrun("eval", args, tmp_path / "rc", {LONG_TIMEOUT_ENV: "5"})
    rank1 = _rank_pid(torchrun, 1)
    # Once rank 1's env workers run (children of its forkserver), it is stopped amid its episodes.
    _wait_for(lambda: any(len(_children(pid)) >= 2 for pid in _children(rank1)), torchrun)
    os.kill(rank1, signal.SIGSTOP)
    try:
        _wait_for(lambda: (tmp_path / "rc/rank0").exists(), torchrun, timeout=120)
    finally:
        os.kill(rank1, signal.SIGCONT)
    err = _finish(torchrun)
    assert _exit_codes(tmp_path / "rc") == {0: 2, 1: 2}, err[-3000:]
    timeout = "did not answer within 5 s"
    assert sorted(_error_lines(err)) == [
        f"error: rank 0: stopped because rank 1 {timeout}",
        f"error: rank 1: stopped because rank 0 gave up waiting for this process: it {timeout}",
    ], err[-3000:]
    assert _no_project_traceback(err), err[-3000:]
    assert not (tmp_path / "eval/eval_info.json").exists()


def test_sigterm_to_torchrun_stops_every_rank_cleanly_yet_torchrun_exits_1(tmp_path):
    from lerobot.checkpoints.run import load_training_state
    from lerobot.checkpoints.run_layout import latest_checkpoint

    run = tmp_path / "run"
    torchrun = _torchrun("train", _diffusion_args(tmp_path, run), tmp_path / "rc")
    _wait_for(lambda: len(_train_steps(run)) >= 3, torchrun)
    torchrun.send_signal(signal.SIGTERM)  # forwarded to both ranks
    err = _finish(torchrun)
    # Both ranks stopped cleanly at the same step with a checkpoint of it, and exit 0 ...
    assert _exit_codes(tmp_path / "rc") == {0: 0, 1: 0}, err[-3000:]
    stops = re.findall(r"stopped by [^\r\n]*", err)
    assert len(stops) == 1 and stops[0].startswith(
        "stopped by SIGTERM (received by all 2 processes) at step "
    )
    step = int(stops[0].split(" at step ")[1].split(",")[0])
    assert (
        latest_checkpoint(run).name == f"{step:09d}"
        and load_training_state(latest_checkpoint(run))["step"] == step
    )
    # ... but torchrun re-raises the signal it got once its workers have ended (torch 2.14: SignalException
    # in the agent), whatever their exit codes: 1 and a traceback of torchrun's own.
    assert torchrun.returncode == 1 and "SignalException" in err
    assert _no_project_traceback(err), err[-3000:]


def test_sigterm_to_rank_1_is_named_by_the_main_process_and_torchrun_exits_0(tmp_path):
    from lerobot.checkpoints.run_layout import latest_checkpoint

    run = tmp_path / "run"
    torchrun = _torchrun("train", _diffusion_args(tmp_path, run), tmp_path / "rc")
    _wait_for(lambda: len(_train_steps(run)) >= 3, torchrun)
    os.kill(_rank_pid(torchrun, 1), signal.SIGTERM)
    err = _finish(torchrun)
    assert _exit_codes(tmp_path / "rc") == {0: 0, 1: 0}, err[-3000:]
    # The signal went to a worker, not to torchrun: every worker exits 0, so torchrun does too.
    assert torchrun.returncode == 0, err[-3000:]
    stops = re.findall(r"stopped by [^\r\n]*", err)
    assert len(stops) == 1 and stops[0].startswith("stopped by SIGTERM (received by rank 1) at step "), err[
        -3000:
    ]
    step = int(stops[0].split(" at step ")[1].split(",")[0])
    assert latest_checkpoint(run).name == f"{step:09d}" and "Traceback" not in err


def _kill_an_env_worker_once_running() -> None:
    """Make the next evaluation of this process SIGKILL its first env worker once its envs are up."""
    import lerobot.evaluation as evaluation

    make_env = evaluation.make_env

    def make_env_and_kill_a_worker(*args, **kwargs):
        env = make_env(*args, **kwargs)
        os.kill(env.processes[0].pid, signal.SIGKILL)
        return env

    evaluation.make_env = make_env_and_kill_a_worker


def _rank_main(rc_dir: str, kind: str, *args: str) -> int:
    """One rank under torchrun: the command line's train or eval with `args`; its exit code goes to
    `rc_dir/rank<RANK>` too."""
    from lerobot import distributed
    from lerobot.cli import eval_main, train_main

    if os.environ.get(KILL_ENV_WORKER_ENV) == os.environ["RANK"]:
        _kill_an_env_worker_once_running()
    if LONG_TIMEOUT_ENV in os.environ:
        distributed.LONG_TIMEOUT = dt.timedelta(seconds=float(os.environ[LONG_TIMEOUT_ENV]))
    code = (train_main if kind == "train" else eval_main)(list(args))
    Path(rc_dir, f"rank{os.environ['RANK']}").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(_rank_main(*sys.argv[1:]))
