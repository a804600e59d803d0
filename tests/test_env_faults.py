"""Faults in evaluation, reproduced for real: a worker killed (`kill -9`) or stopped (SIGSTOP), Ctrl-C while a
worker is stopped, torch in env workers, NaN actions, and every autoreset mode with idle slots."""

import functools
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from test_rollout import ChaseKeypointPolicy, EchoSeedPolicy, _pusht_env_cfg, reference, strip
from toy_env import make_toy

import lerobot.envs.factory as factory
from lerobot.envs import make_env
from lerobot.envs.faults import Watchdog, close_now, worker_call
from lerobot.errors import NonFiniteActionError
from lerobot.rollout import EnvWorkerError, eval_policy

REPO = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """The process has exited and been reaped (a zombie still counts as there)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return sorted(kids)


def _fault_during_eval(sig: signal.Signals, victim: int, step_timeout_s: float | None):
    """Evaluate on 4 async PushT envs, send `sig` to worker `victim` once the rollout runs; return the error,
    the seconds from the signal to the error and the worker pids."""
    env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 4, use_async=True, copy=False)
    pids = [p.pid for p in env.processes]
    sent = {}

    def send():
        time.sleep(1.0)
        sent["t"] = time.monotonic()
        os.kill(pids[victim], sig)

    threading.Thread(target=send, daemon=True).start()
    try:
        with pytest.raises(EnvWorkerError) as err:
            eval_policy(env, ChaseKeypointPolicy(), 5000, progress=False, step_timeout_s=step_timeout_s)
        elapsed = time.monotonic() - sent["t"]
        start = time.monotonic()
        env.close()  # what every caller does in its `finally`: must return at once
        assert time.monotonic() - start < 1.0
    finally:
        for pid in pids:  # a failing test must not leave a stopped worker behind
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    return str(err.value), elapsed, pids


@pytest.mark.parametrize("victim", [1, 3])
def test_killed_worker_ends_eval_at_once_and_no_worker_survives(victim):
    message, elapsed, pids = _fault_during_eval(signal.SIGKILL, victim, step_timeout_s=None)
    assert f"env worker {victim} of 4 (pid {pids[victim]}, killed by SIGKILL" in message
    assert "\n" not in message
    assert elapsed < 8.0  # typically 1-3 s; generous for a loaded 2-core machine
    assert all(_gone(pid) for pid in pids)


def test_stopped_worker_ends_eval_after_the_step_timeout_and_no_worker_survives():
    message, elapsed, pids = _fault_during_eval(signal.SIGSTOP, 2, step_timeout_s=2.0)
    assert f"env worker 2 (pid {pids[2]}) of 4 did not answer a" in message and "within 2 s" in message
    assert 1.5 < elapsed < 2.0 + 4.0
    assert all(_gone(pid) for pid in pids)


def test_worker_stuck_at_start_up_fails_after_the_start_timeout(monkeypatch):
    monkeypatch.setattr(factory, "ASYNC_START_TIMEOUT_S", 2.0)
    before = set(_children(os.getpid()))
    start = time.monotonic()
    with pytest.raises(
        EnvWorkerError, match=r"env worker 0 \(pid \d+\), env worker 1 .* start-up within 2 s"
    ):
        factory._AsyncVectorEnv([functools.partial(make_toy, worker_start_delay_s=60)] * 2, context="spawn")
    assert time.monotonic() - start < 2.0 + 15  # + the spawn of two workers on a busy machine
    assert all(_gone(pid) for pid in set(_children(os.getpid())) - before)


def test_worker_stopped_halfway_through_a_reply_is_caught_by_the_watchdog():
    """A 3 MB frame fills the pipe; stopped mid-send, the worker passes gymnasium's poll and blocks its read."""
    env = AsyncVectorEnv([functools.partial(make_toy, frame_side=1024)] * 2, context="spawn")
    pids = [p.pid for p in env.processes]
    watchdog = Watchdog(env)
    try:
        env.reset(seed=0)
        env.call_async("render")
        time.sleep(1.0)  # both workers now block on a full pipe
        os.kill(pids[1], signal.SIGSTOP)
        start = time.monotonic()
        message = rf"env worker 1 \(pid {pids[1]}\) of 2 did not finish a render"
        with pytest.raises(EnvWorkerError, match=message), worker_call(env, "render", 1.0, watchdog=watchdog):
            env.call_wait(timeout=1.0)
        assert time.monotonic() - start < 1.0 + 2.0 + 3.0
    finally:
        watchdog.close()
        close_now(env)
    assert all(_gone(pid) for pid in pids)


_EVAL_WITH_PIDS = """
from test_rollout import ChaseKeypointPolicy, _pusht_env_cfg
import lerobot.envs.factory as factory
from lerobot.envs import make_env
from lerobot.envs.faults import Watchdog, close_now, worker_call
from lerobot.rollout import eval_policy
env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 3, use_async=True)
print(" ".join(str(p.pid) for p in env.processes), flush=True)
try:
    eval_policy(env, ChaseKeypointPolicy(), 5000, progress=False)
finally:
    env.close()
"""


def test_ctrl_c_while_a_worker_is_stopped_ends_the_program_and_its_workers():
    """No step timeout, a stopped worker: the rollout waits; Ctrl-C must still end it (and the workers)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _EVAL_WITH_PIDS],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3
        time.sleep(1.0)
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(1.0)  # the rollout now waits on the stopped worker
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
        assert time.monotonic() - start < 10
        assert proc.returncode != 0
        assert all(_gone(pid) for pid in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_cli_eval_with_a_killed_worker_exits_2_with_one_line(tmp_path):
    """The issue's repro: `scripts/eval.py ... eval.use_async_envs=true`, then `kill -9` the second worker."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "scripts/eval.py",
            "policy=random",
            "env=pusht_keypoints",
            "eval.n_episodes=5000",
            "eval.batch_size=4",
            "eval.use_async_envs=true",
            "eval.max_episodes_rendered=0",
            "--output-dir",
            str(tmp_path / "eval"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 4:  # workers are the forkserver's children
            workers = [w for server in _children(proc.pid) for w in _children(server)]
            time.sleep(0.2)
        assert len(workers) == 4
        time.sleep(1.0)
        os.kill(workers[1], signal.SIGKILL)
        start = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10
        assert proc.returncode == 2
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("error: env worker 1 of 4") and "killed by SIGKILL" in last
        assert "Traceback" not in stderr
        assert all(_gone(pid) for pid in workers)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_to_the_process_group_ends_cli_eval_with_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the workers ignore it, the main process ends
    the evaluation, its workers and itself with one line and the shell's exit code 130."""
    cmd = [sys.executable, "scripts/eval.py", "policy=random", "env=pusht_keypoints", "eval.n_episodes=5000"]
    cmd += ["eval.batch_size=3", "eval.use_async_envs=true", "eval.max_episodes_rendered=0"]
    proc = subprocess.Popen(
        [*cmd, "--output-dir", str(tmp_path / "eval")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, as a terminal job has
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 3:
            workers = [w for server in _children(proc.pid) for w in _children(server)]
            time.sleep(0.2)
        assert len(workers) == 3
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 130, stderr
        assert stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)" and "Traceback" not in stderr
        assert all(_gone(pid) for pid in workers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_env_workers_do_not_import_torch():
    """Each worker builds its env from `lerobot.envs.worker`; torch would cost it ~350 MB (PSS)."""
    code = (
        "import sys, lerobot.envs, lerobot.envs.worker; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True
    )
    env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 2, use_async=True)
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        for process in env.processes:
            with open(f"/proc/{process.pid}/maps") as f:
                libraries = f.read()
            assert "libtorch" not in libraries
            with open(f"/proc/{process.pid}/smaps_rollup") as f:
                rss_kb = next(int(line.split()[1]) for line in f if line.startswith("Rss:"))
            assert rss_kb < 250 * 1024  # ~85 MB without torch, ~560 MB with it (docs/evaluation.md)
    finally:
        env.close()
    with open(f"/proc/{os.getpid()}/maps") as f:
        assert "libtorch" in f.read()  # the check above can tell: this (parent) process has torch loaded


class NaNAtStep(ChaseKeypointPolicy):
    """ChaseKeypointPolicy whose chunk for env slot `slot` is NaN from its `call`-th prediction on; with
    `only_second_x`, only that chunk's second action has a NaN (its x), and only in the `call`-th."""

    def __init__(self, slot: int, call: int, only_second_x: bool = False):
        super().__init__()
        self.slot, self.call, self.calls, self.only_second_x = slot, call, 0, only_second_x

    def predict_action_chunk(self, batch):
        chunk = super().predict_action_chunk(batch)
        self.calls += 1
        if self.only_second_x:
            if self.calls == self.call:
                chunk[self.slot, 1, 0] = float("nan")
        elif self.calls >= self.call and chunk.shape[0] > self.slot:
            chunk[self.slot] = float("nan")
        return chunk


def test_nan_action_is_refused_naming_slot_and_step():
    env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 3)
    try:
        # Two actions per chunk: the 3rd prediction serves steps 5 and 6 of the first episodes.
        with pytest.raises(NonFiniteActionError, match=r"env slot 1, episode 1 \(seed 101\) at its step 5;"):
            eval_policy(env, NaNAtStep(slot=1, call=3), 6, start_seed=100, progress=False)
        # The NaN never reached the env: its agent is where 4 finite actions put it.
        assert np.isfinite(np.asarray(env.envs[1].unwrapped.agent.position)).all()
    finally:
        env.close()


def test_a_chunk_with_a_later_nan_is_refused_when_predicted_and_none_of_it_is_sent():
    env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 2)
    try:
        clean = eval_policy(env, ChaseKeypointPolicy(), 2, start_seed=100, progress=False)
        assert clean["aggregated"]["n_episodes"] == 2
        # The 3rd chunk serves steps 5 and 6; its action for step 6 of slot 0 is NaN: refused at step 5.
        with pytest.raises(
            NonFiniteActionError,
            match=r"\[nan, [-0-9.e]+\] for env slot 0, episode 0 \(seed 100\) at its step 5 "
            r"\(in the chunk predicted then, 1 step ahead\); it was not sent",
        ) as refused:
            eval_policy(env, NaNAtStep(slot=0, call=3, only_second_x=True), 2, start_seed=100, progress=False)
        assert (refused.value.slot, refused.value.steps_ahead) == (0, 1)
        # Four finite actions were sent, none of the refused chunk: the agent is where they put it.
        after_four = make_env(_pusht_env_cfg("pusht_keypoints", 4), 2)
        try:
            eval_policy(after_four, ChaseKeypointPolicy(), 2, start_seed=100, progress=False)
            want = np.asarray(after_four.envs[0].unwrapped.agent.position)
        finally:
            after_four.close()
        assert np.allclose(np.asarray(env.envs[0].unwrapped.agent.position), want)
    finally:
        env.close()


def test_select_action_refuses_a_non_finite_chunk_naming_where_it_is():
    policy = NaNAtStep(slot=1, call=1, only_second_x=True)
    batch = {"observation.environment_state": torch.zeros(3, 16)}
    with pytest.raises(NonFiniteActionError, match=r"non-finite action \[nan, 25.0\] for env slot 1") as e:
        policy.select_action(batch)
    assert (e.value.slot, e.value.steps_ahead) == (1, 1)


class ConstantPolicy(ChaseKeypointPolicy):
    """Every action of every chunk is `value` in both coordinates."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def predict_action_chunk(self, batch):
        return torch.full_like(super().predict_action_chunk(batch), self.value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_every_non_finite_value_is_refused(value):
    env = make_env(_pusht_env_cfg("pusht_keypoints", 300), 2)
    try:
        with pytest.raises(NonFiniteActionError, match=r"env slot 0, episode 0 \(seed 0\) at its step 1;"):
            eval_policy(env, ConstantPolicy(value), 2, progress=False)
    finally:
        env.close()


def test_finite_actions_whose_sum_overflows_float32_are_sent():
    """The finiteness check sums the actions first: finite values whose float32 sum would overflow are
    neither refused nor warned about."""
    env = make_env(_pusht_env_cfg("pusht_keypoints", 3), 2)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="overflow", category=RuntimeWarning)
            result = eval_policy(env, ConstantPolicy(3e38), 2, progress=False)
        assert [e["n_steps"] for e in result["per_episode"]] == [3, 3]
    finally:
        env.close()


@pytest.mark.parametrize("num_envs", [3, 4, 5])
@pytest.mark.parametrize("schedule", ["refill", "refill_aligned", "batch"])
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_every_autoreset_mode_schedule_and_env_count_counts_exactly(mode, schedule, num_envs):
    """Idle slots step too; with autoreset DISABLED a slot whose filler episode ended must be reset."""
    want = reference(make_toy, EchoSeedPolicy(), 9, 0)
    env = SyncVectorEnv([make_toy] * num_envs, autoreset_mode=mode)
    got = eval_policy(env, EchoSeedPolicy(), 9, start_seed=0, progress=False, schedule=schedule)
    assert strip(got["per_episode"]) == want


def test_async_autoreset_disabled_counts_exactly():
    want = reference(make_toy, EchoSeedPolicy(), 9, 0)
    env = AsyncVectorEnv([make_toy] * 4, context="spawn", autoreset_mode=AutoresetMode.DISABLED)
    try:
        got = eval_policy(env, EchoSeedPolicy(), 9, start_seed=0, progress=False, schedule="batch")
    finally:
        env.close()
    assert strip(got["per_episode"]) == want
