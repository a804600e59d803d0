"""Round four of faults, in the online (TD-MPC) trainer, each with a real fault: an async env worker stopped
(SIGSTOP) or killed (`kill -9`) during collection, a SIGTERM while a collection step waits on a stopped
worker, a stop signal in the middle of a long burst of updates and of a collection, a branch with another
`training.n_envs` and `buffer_capacity`, non-finite replay exponents, the time estimate of an online run
and the slow-run warning of a CPU recipe, and a resume to fewer steps than the run has made."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from gymnasium.vector import AutoresetMode
from test_checkpoint_faults import KEYPOINTS
from test_dataset import ZARR, write_fake_zarr
from test_env_faults import _children, _gone
from test_online_train import TINY
from test_replay_buffer import SCRIPTS_3, collect, stored
from test_run_lifecycle import ENDLESS, last_line, launch, train_steps, wait_for

from lerobot.checkpoints.run import load_training_state
from lerobot.checkpoints.run_layout import checkpoint_dir, latest_checkpoint
from lerobot.cli import compose_train_config, train_main
from lerobot.cli.recipes import slow_cpu_run_advice
from lerobot.config import CONFIG_DIR
from lerobot.constants import OBS_STATE
from lerobot.runtime.signals import StopAborted, StopRequest, WaitInterrupted
from lerobot.training.replay_buffer import ReplayBuffer
from lerobot.training.schedule import UpdateSchedule
from lerobot.training.update import TrainStep

ASYNC = ["training.use_async_envs=true", "training.log_freq=2"]


def async_run(run: Path, *extra: str):
    """An endless tiny TD-MPC run on 2 async env workers, past its first updates; (process, worker pids)."""
    proc = launch([*TINY, *ENDLESS, *ASYNC, f"output_dir={run}", *extra])
    wait_for(lambda: len(train_steps(run)) >= 8, proc)  # 16 transitions: the policy acts and updates run
    workers = [w for server in _children(proc.pid) for w in _children(server)]
    assert len(workers) == 2, workers
    return proc, workers


def finish(proc, workers: list[int], timeout: float = 60) -> tuple[int, str]:
    """Wait for the run to exit (its stderr closed: no process of it left holding it); (exit code, stderr)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        for pid in workers:  # a failing test leaves no stopped worker behind
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


# ------------------------------------------------ row 3: a stopped env worker during collection
def test_a_stopped_env_worker_ends_collection_after_the_step_timeout_with_a_checkpoint(tmp_path):
    """It hung forever: the collection's steps now wait at most `eval.step_timeout_s` too, and the run ends
    with one line naming the worker, after a checkpoint of the last step it completed."""
    run = tmp_path / "run"
    proc, workers = async_run(run, "eval.step_timeout_s=2")
    os.kill(workers[1], signal.SIGSTOP)
    start = time.monotonic()
    code, err = finish(proc, workers)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert time.monotonic() - start < 2 + 20
    (line,) = error_lines(err)
    assert line == last_line(err)
    assert f"env worker 1 (pid {workers[1]}) of 2 did not answer a step within 2 s" in line
    stopped = int(line.split(" holds the run at ")[1].split(" transitions")[0])
    state = load_training_state(latest_checkpoint(run))
    assert state["transitions"] == stopped and stopped % 2 == 0 and stopped >= 16
    assert f"checkpoint {stopped:09d}" in line and f"output_dir={run}" in line
    assert all(_gone(pid) for pid in workers)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_collection_step_waiting_on_a_stopped_worker(tmp_path, signum):
    """SIGTERM logged "stopping after the current step" and nothing more (the step never ended), and Ctrl-C
    after it did nothing either: the wait is now abandoned, and the run stops at the last step it
    completed, with its checkpoint, long before the step timeout (120 s)."""
    run = tmp_path / "run"
    proc, workers = async_run(run)
    os.kill(workers[0], signal.SIGSTOP)
    time.sleep(1.0)  # the collection now waits on the stopped worker
    start = time.monotonic()
    os.killpg(proc.pid, signum)  # the whole process group, as a scheduler or a terminal sends it
    code, err = finish(proc, workers)
    assert time.monotonic() - start < 20
    assert code == (0 if signum == signal.SIGTERM else 130) and "Traceback" not in err, err[-3000:]
    line = last_line(err)
    assert line.startswith(f"stopped by {signal.Signals(signum).name} at step "), err[-3000:]
    stopped = int(line.split(" at step ")[1].split(",")[0])
    state = load_training_state(latest_checkpoint(run))
    assert state["transitions"] == stopped and state["collection_steps"] == 0
    assert all(_gone(pid) for pid in workers)


def test_ctrl_c_after_another_stop_signal_aborts_at_once():
    """ "Ctrl-C again aborts at once" held only when the first signal was a Ctrl-C; after a SIGTERM, two
    Ctrl-Cs did nothing. A wait on env workers (`waiting`) is abandoned by the first signal."""
    request = StopRequest()
    with request.armed():
        with pytest.raises(WaitInterrupted), request.waiting():
            request.handle(signal.SIGTERM, None)
        assert request.signum == signal.SIGTERM
        with pytest.raises(WaitInterrupted), request.waiting():  # one already received: at once
            pass
        with pytest.raises(StopAborted):
            request.handle(signal.SIGINT, None)


# ---------------------------------------------------- row 3b: a killed env worker during collection
def test_a_killed_env_worker_ends_collection_with_one_line_and_a_checkpoint_that_resumes(tmp_path, capsys):
    """`kill -9` of a worker gave a ConnectionResetError traceback, exit code 1, and lost the steps since the
    last checkpoint."""
    run = tmp_path / "run"
    proc, workers = async_run(run)
    os.kill(workers[0], signal.SIGKILL)
    code, err = finish(proc, workers)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    (line,) = error_lines(err)
    assert f"env worker 0 of 2 (pid {workers[0]}, killed by SIGKILL" in line and "died during" in line
    stopped = int(line.split(" holds the run at ")[1].split(" transitions")[0])
    assert latest_checkpoint(run) == checkpoint_dir(run, stopped).resolve()
    assert all(_gone(pid) for pid in workers)

    # The same run goes on from there (here with sync envs: `training.use_async_envs` may change).
    args = [*TINY, "eval.freq=0", f"output_dir={run}", f"training.steps={stopped + 4}"]
    assert train_main(args) == 0
    assert load_training_state(latest_checkpoint(run))["transitions"] == stopped + 4


# ------------------------------------------- row 14: a stop in the middle of a burst of updates
BURST = [*TINY, "training.initial_updates=40", "eval.freq=0", "training.log_freq=2", "training.steps=24"]


@pytest.mark.parametrize("save_buffer", [True, False])
def test_a_stop_during_a_burst_of_updates_saves_what_is_owed_and_the_resume_makes_it(
    tmp_path, monkeypatch, save_buffer
):
    """A Ctrl-C during TD-MPC's 5,000 updates at `learning_starts` waited for all of them (220 s on the CPU
    recipe): the loop now checks between updates, and the checkpoint records the updates still owed, which
    the resumed run makes first (without a saved buffer: once it holds `learning_starts` transitions again),
    so that it makes as many as an uninterrupted run, bar those a resume without its buffer always skips."""
    args = [*BURST, f"training.save_buffer={str(save_buffer).lower()}", f"output_dir={tmp_path / 'run'}"]
    calls = []
    real_update = TrainStep.__call__

    def update_then_ctrl_c(self, batch, where):
        output = real_update(self, batch, where)
        calls.append(where)
        if len(calls) == 5:  # inside the burst of 2 + 40 updates after transition 12
            os.kill(os.getpid(), signal.SIGINT)
        return output

    monkeypatch.setattr(TrainStep, "__call__", update_then_ctrl_c)
    assert train_main(args) == 130
    state = load_training_state(latest_checkpoint(tmp_path / "run"))
    assert len(calls) == 5 and state["transitions"] == 12
    assert state["updates"] == 5 and state["updates_owed"] == 2 + 40 - 5

    monkeypatch.setattr(TrainStep, "__call__", real_update)
    assert train_main(args) == 0
    state = load_training_state(latest_checkpoint(tmp_path / "run"))
    assert state["transitions"] == 24 and state["updates_owed"] == 0
    schedule = UpdateSchedule(n_envs=2, gradient_steps=-1, learning_starts=10, initial_updates=40)
    # Without its buffer the resumed run collects 10 transitions (to 22) before it updates again.
    skipped = 0 if save_buffer else 4 * 2
    assert state["updates"] == schedule.count_updates(24) - skipped == 42 + 6 * 2 - skipped


def test_a_stop_in_the_middle_of_a_collection_is_taken_up_by_the_resumed_run(tmp_path, monkeypatch):
    """With `training.train_freq` vector steps per collection, a stop ends the collection at a vector step;
    the resumed run takes the rest of it, then its updates."""
    import lerobot.training.collector as collector

    run = tmp_path / "run"
    args = [*TINY, "training.train_freq=4", "training.save_buffer=true", "eval.freq=0", "training.log_freq=8"]
    args.append(f"output_dir={run}")
    steps = []
    real_step = collector.step_envs

    def step_then_sigterm(*args):
        steps.append(1)
        if len(steps) == 10:  # the second vector step of the third collection
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args)

    monkeypatch.setattr(collector, "step_envs", step_then_sigterm)
    assert train_main([*args, "training.steps=40"]) == 0
    state = load_training_state(latest_checkpoint(run))
    assert state["transitions"] == 20 and state["collection_steps"] == 2 and state["updates_owed"] == 0
    assert state["updates"] == UpdateSchedule(2, 4, -1, 10).count_updates(16)

    assert train_main([*args, "training.steps=40"]) == 0
    state = load_training_state(latest_checkpoint(run))
    assert state["transitions"] == 40 and state["collection_steps"] == 0
    assert state["updates"] == UpdateSchedule(2, 4, -1, 10).count_updates(40)


# -------------------------------------------- row 10: a branch with another n_envs or buffer size
def test_a_saved_buffer_is_copied_into_another_layout():
    """Each saved env's newest transitions go to one env of the new layout; every sub-trajectory drawn
    from it is one of the saved buffer's, and none joins two envs' transitions or a new episode."""
    saved = collect(SCRIPTS_3, 14, AutoresetMode.NEXT_STEP)
    for n_envs, capacity in [(1, 100), (2, 12), (5, 40)]:
        buffer = ReplayBuffer(capacity, n_envs=n_envs)
        buffer.load_state_dict(saved.state_dict())
        keep = buffer.rows // math.ceil(3 / n_envs)
        kept = {rec for env in range(3) for rec in stored(saved, env)[-keep:]}
        copied = {rec for env in range(n_envs) for rec in stored(buffer, env)}
        assert copied == kept, (n_envs, capacity)
        o = buffer.sample(500, horizon=2)[OBS_STATE]  # [env id, episode, step] of the saved envs
        assert torch.all(o[:, :, :2] == o[:, :1, :2]) and torch.all(o[:, 1:, 2] - o[:, :-1, 2] == 1)
        # The next steps are a new episode in every env: no window joins them to the copied ones.
        for t in range(3):
            step = torch.tensor([[99.0, 0.0, t]] * n_envs)
            buffer.add({OBS_STATE: step}, torch.zeros(n_envs, 1), torch.zeros(n_envs), {OBS_STATE: step + 1},
                       torch.zeros(n_envs), torch.zeros(n_envs))  # fmt: skip
        o = buffer.sample(500, horizon=2)[OBS_STATE]
        assert torch.all((o[:, 0, 0] == 99) == (o[:, 1, 0] == 99))


def test_a_branch_may_change_n_envs_and_buffer_capacity(tmp_path, caplog):
    """`training.init_from` with another `training.n_envs` or `buffer_capacity` ended in a ValueError
    traceback; the saved transitions are now copied into the branch's buffer."""
    base = tmp_path / "base"
    base_args = [*TINY, "training.steps=20", "training.save_buffer=true", "eval.freq=0", f"output_dir={base}"]
    assert train_main(base_args) == 0
    branch = tmp_path / "branch"
    argv = [*TINY, "training.n_envs=3", "training.buffer_capacity=24", "training.save_buffer=true"]
    argv += ["eval.freq=0", f"training.init_from={base}", f"output_dir={branch}", "training.steps=26"]
    with caplog.at_level(logging.INFO, logger="lerobot.training.online_state"):
        assert train_main(argv) == 0
    assert "the replay buffer's 20 transitions of 2 envs copied into 8 rows x 3 envs: 16 kept" in caplog.text
    state = load_training_state(latest_checkpoint(branch))
    buffer = state["replay_buffer"]
    assert (buffer["rows"], buffer["n_envs"]) == (8, 3) and state["transitions"] == 26
    assert int(buffer["data"]["valid"].sum()) == 16 - 2 * 2 + 2 * 3  # 2 rows overwritten by 2 vector steps


# ------------------------------------------------------ row 12: non-finite replay exponents
@pytest.mark.parametrize(
    "override",
    ["training.per_alpha=nan", "training.per_alpha=inf", "training.per_beta=nan", "training.utd_ratio=inf"],
)
def test_a_non_finite_replay_setting_is_one_line_at_start_up(tmp_path, capsys, override):
    """A NaN `per_alpha` was accepted and replayed uniformly, with nan in the saved config."""
    args = [*TINY, "training.steps=2", "eval.freq=0", override, f"output_dir={tmp_path / 'run'}"]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    (line,) = error_lines(err)
    assert line.startswith(f"error: {override} must be a finite number") and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# -------------------------------------------- row 17: the time estimate, and the slow-run warning
def test_an_online_run_on_the_cpu_estimates_its_time_once_learning_has_started(tmp_path, caplog):
    """The README promises a line estimating the run's time; online runs printed none. It comes once the
    policy acts and the first burst of updates is made (the random steps before are far cheaper)."""
    args = [*TINY, "eval.freq=0", "device=cpu", "training.steps=40", f"output_dir={tmp_path}"]
    with caplog.at_level(logging.INFO, logger="lerobot.training.pace"):
        assert train_main(args) == 0
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("estimate: ")]
    # Measured over collections 2 to 11 after the one that crossed learning_starts (ending at 34).
    assert "s per step, 6 steps left" in line


def test_the_slow_run_warning_names_only_the_recipes_that_apply(tmp_path, caplog, monkeypatch):
    """The CPU recipe of the main job warned that "the paper-size models need a GPU" and named recipe=auto,
    which it already was; the warning now names the GPU recipe of the run's own policy and env, the CPU
    recipe where the run is not one, or neither where none exists."""

    def advice(*overrides: str) -> str:
        return slow_cpu_run_advice(compose_train_config(list(overrides)), [CONFIG_DIR])

    cpu_recipe = advice("+experiment=diffusion_pusht_image_cpu")
    assert cpu_recipe == (
        "on a GPU, +experiment=diffusion_pusht_gpu trains the paper-size model; or lower training.steps"
    )
    paper = advice("policy=diffusion", "env=pusht", "recipe=paper")
    assert "needs a GPU (+experiment=diffusion_pusht_gpu)" in paper
    assert "+experiment=diffusion_pusht_image_cpu trains the CPU recipe" in paper
    keypoints = advice("policy=act", "env=pusht_keypoints", "recipe=paper")  # no GPU recipe for it
    assert "GPU" not in keypoints and "+experiment=act_pusht_keypoints_cpu" in keypoints
    assert advice("+experiment=tdmpc_dmc_cpu") == "lower training.steps"

    # An online run says it too, once it knows its pace.
    monkeypatch.setattr("lerobot.training.pace.CPU_WARN_HOURS", 1e-7)  # any run is "slow"
    args = [*TINY, "eval.freq=0", "device=cpu", "training.steps=40", f"output_dir={tmp_path}"]
    with caplog.at_level(logging.WARNING, logger="lerobot.training.pace"):
        assert train_main(args) == 0
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("on the CPU this run")]
    assert line.endswith("6 steps left); lower training.steps")


# ---------------------------------------------- extra: a resume to fewer steps than the run made
@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


@pytest.mark.parametrize("trainer", ["online", "offline"])
def test_a_resume_below_the_runs_step_says_so_and_trains_nothing(tmp_path, caplog, data_args, trainer):
    run = tmp_path / "run"
    args = [*TINY] if trainer == "online" else [*KEYPOINTS, *data_args, "training.save_freq=4"]
    args += ["eval.freq=0", f"output_dir={run}"]
    assert train_main([*args, "training.steps=8"]) == 0
    metrics = (run / "metrics.jsonl").read_text()
    with caplog.at_level(logging.WARNING):
        assert train_main([*args, "training.steps=4"]) == 0
    (line,) = [r.getMessage() for r in caplog.records if "nothing to train" in r.getMessage()]
    assert line.startswith("the run stands at step 8, past training.steps=4: nothing to train")
    assert latest_checkpoint(run).name == "000000008" and (run / "metrics.jsonl").read_text() == metrics
