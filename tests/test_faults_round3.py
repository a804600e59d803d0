"""Nothing lost, nothing silent, round three (evaluation, sweeps, config and script faults): each case runs
the real fault where this machine allows it (real signals to real processes, read-only and full file
systems) and the commands as the README and the docs write them."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_dataset import ZARR, write_fake_zarr
from test_train import TINY

from lerobot.cli import eval_main, train_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


# ------------------------------------------------------------------------------------------------- sweeps
def test_the_readme_sweep_without_a_sweep_dir_writes_its_summary_in_the_default_directory(
    tmp_path, data_args
):
    # The README's shape, `python scripts/train.py -m <overrides> seed=1,2`, with no hydra.sweep.dir, run as a
    # user runs it (its own process, from another directory): the default directory (which names the env and
    # the policy) is resolved once, before the jobs run.
    job = [*TINY, "env=pusht_keypoints", "training.steps=2", "training.save_freq=2", "eval.freq=0"]
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "-m", *job, *data_args, "seed=1,2"],
        cwd=tmp_path,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (summary,) = (tmp_path / "outputs" / "multirun").glob("*/*_pusht_keypoints_diffusion/summary.json")
    jobs = json.loads(summary.read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    assert [Path(j["run_dir"]).resolve() for j in jobs] == [summary.parent.resolve() / n for n in ("0", "1")]
    assert all(j["final"]["train"]["step"] == 2 for j in jobs)
    assert f"sweep summary: {summary.relative_to(tmp_path)}" in done.stdout


# ------------------------------------------------------------------------------------------------ helpers
RANDOM_EVAL = ["policy=random", "env=pusht_keypoints", "eval.batch_size=2", "eval.use_async_envs=false"]


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "OMP_NUM_THREADS": "1"}


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _wait_for_line(stream, text: str, timeout_s: float = 120.0) -> list[str]:
    """Lines of `stream` read until one holds `text` (a process's log, read as it writes it)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came: {''.join(lines)[-2000:]}")


def _grandchildren(pid: int) -> list[int]:
    """The children of the children of `pid` (async env workers are the forkserver's children)."""

    def children(parent: int) -> list[int]:
        path = Path(f"/proc/{parent}/task/{parent}/children")
        return [int(c) for c in path.read_text().split()] if path.exists() else []

    return [grandchild for child in children(pid) for grandchild in children(child)]


def _mounts_work() -> bool:
    """Whether a small tmpfs can be mounted in a private mount namespace (as root, or through an
    unprivileged user namespace): nothing outside that namespace sees it."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"], capture_output=True
        )
    return probe.returncode == 0


NEEDS_MOUNTS = pytest.mark.skipif(
    not _mounts_work(), reason="needs a private mount namespace (unshare -rm) to mount a small tmpfs"
)


def _in_namespace(mounts: list[str], script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` run by Python with `args` after `mounts` (`mount ...` commands) in a private mount namespace."""
    command = " && ".join([*mounts, f'exec "$0" -c {shlex.quote(script)} "$@"'])
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", command, sys.executable, *args],
        cwd=REPO,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


# A script that runs commands as `scripts/*.py` run them and prints each one's exit code on stdout.
_COMMANDS = """
import json, sys
from lerobot.cli import eval_main, train_main
for name, argv in json.loads(sys.argv[1]):
    print({"train": train_main, "eval": eval_main}[name](argv), flush=True)
"""


# --------------------------------------------------------------------------------- concurrent evaluations
def test_a_second_evaluation_into_a_directory_being_written_refuses_with_one_line(tmp_path, capsys):
    out = tmp_path / "eval"
    first = subprocess.Popen(
        [sys.executable, "scripts/eval.py", *RANDOM_EVAL, "eval.n_episodes=500", "--output-dir", str(out)],
        cwd=REPO,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_line(first.stderr, "evaluating random on pusht_keypoints")
        assert eval_main([*RANDOM_EVAL, "eval.n_episodes=1", "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert _error_lines(err) == [
            f"error: {out} is being written by another evaluation right now; wait for it to end, or pick "
            "another --output-dir"
        ]
        assert not (out / "eval_info.json").exists()
        # kill -9: the kernel drops the lock with its holder, and the directory is free again.
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert (
        eval_main(
            [*RANDOM_EVAL, "eval.n_episodes=1", "eval.max_episodes_rendered=0", "--output-dir", str(out)]
        )
        == 0
    )
    assert json.loads((out / "eval_info.json").read_text())["aggregated"]["n_episodes"] == 1


# --------------------------------------------------------------------------------- read-only and full disks
@NEEDS_MOUNTS
def test_a_read_only_output_dir_is_one_line_for_training_and_evaluation(tmp_path, data_args):
    ro = tmp_path / "ro"
    ro.mkdir()
    commands = [
        ("train", [*TINY, "env=pusht_keypoints", "training.steps=2", *data_args, f"output_dir={ro}/run"]),
        ("eval", [*RANDOM_EVAL, "eval.n_episodes=1", "--output-dir", f"{ro}/eval"]),
    ]
    run = _in_namespace([f"mount -t tmpfs -o ro,size=64k tmpfs {ro}"], _COMMANDS, json.dumps(commands))
    assert run.stdout.split() == ["2", "2"] and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert _error_lines(run.stderr) == [
        f"error: {ro}/{name}: read-only file system: write elsewhere (output_dir=DIR when training, "
        "--output-dir DIR when evaluating, dataset.cache_dir=DIR for converted datasets) and run again"
        for name in ("run", "eval")
    ]


@NEEDS_MOUNTS
def test_recording_onto_a_full_disk_keeps_the_evaluation_and_leaves_nothing(tmp_path):
    # 96x96 camera frames: 0.55 MB per 20-step episode. The first disk cannot hold one spilled episode (numpy's
    # own write would report it without an errno); the second holds both, but not the converted copy.
    disks = [tmp_path / "spill_full", tmp_path / "convert_full"]
    commands = []
    for disk in disks:
        disk.mkdir()
        argv = ["policy=random", "env=pusht", "env.max_episode_steps=20", "eval.n_episodes=2"]
        argv += ["eval.batch_size=2", "eval.use_async_envs=false", "eval.max_episodes_rendered=0"]
        commands.append(("eval", [*argv, f"eval.record_dataset={disk}/ds", "--output-dir", f"{disk}.eval"]))
    mounts = [f"mount -t tmpfs -o size={size} tmpfs {d}" for size, d in zip(("256k", "1500k"), disks)]
    script = _COMMANDS + "\nfor d in sys.argv[2:]:\n    print(sorted(os.listdir(d)))\n"
    run = _in_namespace(mounts, "import os\n" + script, json.dumps(commands), *map(str, disks))
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.split("\n")[:4] == ["2", "2", "[]", "[]"], run.stdout  # the disks are empty again
    errors = _error_lines(run.stderr)
    assert len(errors) == 2, run.stderr[-3000:]
    for disk, error in zip(disks, errors):
        assert error.startswith(f"error: No space left on device writing {disk}/.ds.")
        assert f"(eval.record_dataset={disk}/ds was not written and nothing of it is left" in error
        assert error.endswith(
            f"the evaluation's figures are in {disk}.eval/eval_info.json): free space and run again"
        )
        info = json.loads((Path(f"{disk}.eval") / "eval_info.json").read_text())
        assert info["aggregated"]["n_episodes"] == 2 and len(info["per_episode"]) == 2


def test_a_killed_recording_leaves_temporaries_that_the_next_recording_deletes(tmp_path):
    record = tmp_path / "datasets" / "episodes_ds"
    record.parent.mkdir()
    argv = [
        *RANDOM_EVAL,
        "eval.n_episodes=500",
        "eval.max_episodes_rendered=0",
        f"eval.record_dataset={record}",
    ]
    first = subprocess.Popen(
        [sys.executable, "scripts/eval.py", *argv, "--output-dir", str(tmp_path / "eval1")],
        cwd=REPO,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        spilled: list[Path] = []
        while time.monotonic() < deadline and not spilled:  # the first episode is spilled
            spilled = list(record.parent.glob(".episodes_ds.episodes.tmp-*/000000000"))
            time.sleep(0.1)
        assert spilled, "the recording never spilled an episode"
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    left = list(record.parent.glob(".episodes_ds.*"))
    assert len(left) == 1 and not record.exists()
    # The next recording into the same directory deletes what the killed one left, and records.
    argv = [
        *RANDOM_EVAL,
        "eval.n_episodes=1",
        "eval.max_episodes_rendered=0",
        f"eval.record_dataset={record}",
    ]
    assert eval_main([*argv, "--output-dir", str(tmp_path / "eval2")]) == 0
    assert sorted(p.name for p in record.parent.iterdir()) == ["episodes_ds"]
    assert json.loads((record / "meta" / "info.json").read_text())["total_episodes"] == 1


# ------------------------------------------------------------------------------------- config directories
def _config_dir(root: Path, env_yaml: str | None = None, policy_yaml: str | None = None) -> Path:
    for group, text in (("env", env_yaml), ("policy", policy_yaml)):
        (root / group).mkdir(parents=True, exist_ok=True)
        if text is not None:
            (root / group / f"my_{group}.yaml").write_text(text)
    return root


def test_yaml_syntax_errors_in_a_config_dir_are_one_line_naming_the_file_and_line(tmp_path, capsys):
    bad_env = _config_dir(tmp_path / "a", env_yaml="name: my_env\n  gym_id: [oops\n")
    assert train_main(["--config-dir", str(bad_env), "env=my_env", "training.steps=1"]) == 2
    assert _error_lines(capsys.readouterr().err) == [
        f"error: {bad_env}/env/my_env.yaml, line 2, column 9: not valid YAML (mapping values are not allowed "
        "here); fix the file's syntax"
    ]
    bad_policy = _config_dir(tmp_path / "b", policy_yaml="name: diffusion\ndown_dims: [16, 32\n")
    assert eval_main(["--config-dir", str(bad_policy), "policy=my_policy", "env=pusht_keypoints"]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: {bad_policy}/policy/my_policy.yaml, line 3, column 1: not valid YAML (")


def test_a_missing_or_mistyped_config_dir_is_refused(tmp_path, capsys):
    given = _config_dir(tmp_path / "configs", env_yaml="name: my_env\n")
    for wrong, problem in (
        (tmp_path / "confgs", ": no such directory"),
        (given / "env", " holds neither env/ nor policy/: pass the directory above them"),
    ):
        assert train_main(["--config-dir", str(wrong), "env=my_env"]) == 2
        assert eval_main(["--config-dir", str(wrong), *RANDOM_EVAL]) == 2
        lines = _error_lines(capsys.readouterr().err)
        assert len(lines) == 2 and all(
            line.startswith(f"error: --config-dir {wrong}{problem}") for line in lines
        )


def test_a_policy_variant_from_a_config_dir_takes_policy_overrides(tmp_path):
    from lerobot.cli.compose import compose_config
    from lerobot.errors import ConfigError

    configs = _config_dir(tmp_path / "configs", policy_yaml="name: diffusion\ndown_dims: [16, 32]\n")
    cfg = compose_config(
        ["policy=my_policy", "env=pusht_keypoints", "policy.n_groups=4"], search_path=[configs]
    )
    assert (cfg.policy.name, list(cfg.policy.down_dims), cfg.policy.n_groups) == ("diffusion", [16, 32], 4)
    with pytest.raises(ConfigError, match="invalid policy config at policy.n_gruops: Key 'n_gruops' not in"):
        compose_config(
            ["policy=my_policy", "env=pusht_keypoints", "policy.n_gruops=4"], search_path=[configs]
        )


def test_a_batch_larger_than_the_dataset_is_one_line(tmp_path, data_args, capsys):
    args = [
        *TINY,
        "env=pusht_keypoints",
        *data_args,
        "training.batch_size=1000",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert train_main(args) == 2
    # The fake dataset holds 4 episodes of 20, 25, 18 and 30 frames.
    assert _error_lines(capsys.readouterr().err) == [
        "error: 93 samples make no full batch of 1000 (drop_last=True): the dataset holds fewer samples than "
        "training.batch_size=1000; set training.batch_size to at most 93"
    ]


# ------------------------------------------------------------------------------------------ frozen workers
def test_the_default_step_timeout_ends_a_frozen_worker_without_polling_each_step(monkeypatch):
    from gymnasium.vector import AsyncVectorEnv
    from test_rollout import EchoSeedPolicy
    from toy_env import make_toy

    from lerobot.cli.compose import compose_config
    from lerobot.config import RootConfig
    from lerobot.errors import EnvWorkerError
    from lerobot.rollout import eval_policy

    assert RootConfig().eval.step_timeout_s == 120.0  # on by default; null stays the way to wait forever
    assert compose_config(["env=pusht_keypoints", "eval.step_timeout_s=null"]).eval.step_timeout_s is None
    # No call to a worker polls gymnasium's pipes with a timeout: the watchdog thread alone enforces it.
    waits = []
    for name in ("step_wait", "reset_wait", "call_wait"):
        wait = getattr(AsyncVectorEnv, name)

        def spy(self, timeout=None, _wait=wait, **kwargs):
            waits.append(timeout)
            return _wait(self, timeout, **kwargs)

        monkeypatch.setattr(AsyncVectorEnv, name, spy)
    # Worker 1 freezes (sleeps, not stopped) at its 3rd step of every episode; worker 0 keeps answering.
    env = AsyncVectorEnv([make_toy, functools.partial(make_toy, hang_at=3)], context="spawn")
    try:
        start = time.monotonic()
        with pytest.raises(
            EnvWorkerError, match=r"^an env worker of 2 did not answer a step within 2 s \(stopped"
        ):
            eval_policy(env, EchoSeedPolicy(), 4, max_episodes_rendered=0, progress=False, step_timeout_s=2.0)
        assert 2.0 <= time.monotonic() - start < 2.0 + 4.0
    finally:
        env.close(terminate=True)
    assert len(waits) > 3 and set(waits) == {None}


def test_an_evaluation_stopped_and_resumed_later_than_the_step_timeout_goes_on(tmp_path):
    """Ctrl-Z, then `fg` two timeouts later: the whole process group was stopped, the workers did not hang."""
    argv = [*RANDOM_EVAL[:-1], "eval.use_async_envs=true", "eval.step_timeout_s=1.5", "eval.n_episodes=8"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "scripts/eval.py",
            *argv,
            "eval.max_episodes_rendered=0",
            "--output-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's job
    )
    err = bytearray()

    def read() -> None:  # the progress bar ends no line: read what comes as it comes
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not re.search(rb"eval episodes: .*\| [1-9]\d*/8", err):
            time.sleep(0.05)  # until the rollout has finished an episode: it runs now
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(4.0)
        # The main process goes on first, its workers a moment later (the order of a group's SIGCONT is
        # not fixed): its watchdog then finds the deadline long past before any worker could answer.
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.7)
        os.killpg(proc.pid, signal.SIGCONT)
        proc.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and not _error_lines(err.decode()), err.decode()[-2000:]
    aggregated = json.loads((tmp_path / "eval_info.json").read_text())["aggregated"]
    assert aggregated["n_episodes"] == 8 and aggregated["eval_s"] > 4.0  # the stop fell into the rollout


# ------------------------------------------------------------------------------------- videos left behind
def _video_temporaries(videos: Path) -> list[str]:
    return sorted(p.name for p in videos.glob(".*.tmp.mp4")) if videos.is_dir() else []


def _eval_with_videos(out: Path) -> subprocess.Popen:
    argv = [*RANDOM_EVAL, "eval.n_episodes=6", "eval.max_episodes_rendered=6", "--output-dir", str(out)]
    return subprocess.Popen(
        [sys.executable, "scripts/eval.py", *argv],
        cwd=REPO,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _when_a_video_is_being_written(proc: subprocess.Popen, videos: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _video_temporaries(videos):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.02)
    assert _video_temporaries(videos), "no video was ever being written"


def test_ctrl_c_twice_while_videos_are_written_is_one_line_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "eval"
    proc = _eval_with_videos(out)
    try:
        _when_a_video_is_being_written(proc, out / "videos")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # 130, or killed by the second SIGINT once the first one's line is out (a shell shows both as 130).
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    assert _video_temporaries(out / "videos") == []


def test_a_video_temporary_left_by_kill_9_neither_blocks_the_directory_nor_stays(tmp_path):
    out = tmp_path / "eval"
    proc = _eval_with_videos(out)
    try:
        _when_a_video_is_being_written(proc, out / "videos")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = _video_temporaries(out / "videos")
    # Killed while writing its first video (one thread writes them in turn): nothing but the temporary.
    assert left and not (out / "eval_info.json").exists()
    assert [p.name for p in (out / "videos").iterdir()] == left
    # The next evaluation into the directory is not refused for it, and deletes it.
    argv = [*RANDOM_EVAL, "eval.n_episodes=1", "eval.max_episodes_rendered=0", "--output-dir", str(out)]
    assert eval_main(argv) == 0
    assert list((out / "videos").iterdir()) == []
    assert json.loads((out / "eval_info.json").read_text())["aggregated"]["n_episodes"] == 1


def test_one_ctrl_c_ends_a_sync_evaluation_whatever_the_env_is_running(tmp_path):
    """gym-pusht steps and renders through pymunk callbacks, which would swallow a KeyboardInterrupt raised
    inside them (with a traceback) and go on; one Ctrl-C must end the evaluation, with one line."""
    argv = [
        *RANDOM_EVAL,
        "eval.n_episodes=200",
        "eval.max_episodes_rendered=200",
        "--output-dir",
        str(tmp_path),
    ]
    for _ in range(1):  # (where it lands is chance: the test below puts it inside a callback every time)
        proc = subprocess.Popen(
            [sys.executable, "scripts/eval.py", *argv, "--overwrite"],
            cwd=REPO,
            env=_child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_line(proc.stderr, "evaluating random on pusht_keypoints")
            time.sleep(1.5)
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            err = proc.communicate(timeout=30)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
        assert time.monotonic() - start < 10
        assert _video_temporaries(tmp_path / "videos") == []


def _space_that_gets_ctrl_c_in_a_callback():
    """A pymunk space (gym-pusht's physics) whose first collision callback receives a real SIGINT."""
    import pymunk

    space = pymunk.Space()
    space.gravity = (0, -100)
    space.add(pymunk.Segment(space.static_body, (-100, 0), (100, 0), 1))
    body = pymunk.Body(1, 10)
    body.position = (0, 1.5)
    space.add(body, pymunk.Circle(body, 1))
    calls = []

    def post_solve(arbiter, space, data):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Python raises it inside this callback

    space.add_default_collision_handler().post_solve = post_solve
    return space, calls


def test_ctrl_c_inside_an_envs_callback_is_raised_after_the_env_call(monkeypatch):
    from lerobot.envs.faults import ENV_CALLS, interrupts_after_env_calls

    dropped = []  # what Python prints as "Exception ignored from cffi callback"
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))
    # The fault: raised inside the C code's callback, the KeyboardInterrupt is printed and dropped.
    space, calls = _space_that_gets_ctrl_c_in_a_callback()
    for _ in range(20):
        space.step(0.02)
    assert len(calls) == 20 and dropped == [KeyboardInterrupt]
    # As the rollout calls a sync env: held back during the call, raised once it returns.
    space, calls = _space_that_gets_ctrl_c_in_a_callback()
    restore = interrupts_after_env_calls()
    try:
        with pytest.raises(KeyboardInterrupt), ENV_CALLS:
            for _ in range(20):
                space.step(0.02)
    finally:
        restore()
    assert len(calls) == 20 and dropped == [KeyboardInterrupt]  # nothing more was dropped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ----------------------------------------------------------------------------------- the small scripts
@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        (
            "plot_runs.py",
            ["{tmp}/missing", "--out", "{tmp}/c.png"],
            "{tmp}/missing/metrics.jsonl not found: pass",
        ),
        (
            "plot_runs.py",
            ["{tmp}/silent", "--out", "{tmp}/c.png"],
            "{tmp}/silent/metrics.jsonl holds no evaluation",
        ),
        ("compare_evals.py", ["{tmp}/missing", "{tmp}/missing"], "no evaluation at {tmp}/missing: expected"),
        ("compare_evals.py", ["{tmp}/bad.json", "{tmp}/bad.json"], "{tmp}/bad.json is not an evaluation's"),
    ],
)
def test_the_scripts_end_bad_input_with_one_error_line_and_status_2(tmp_path, script, args, message):
    (tmp_path / "silent").mkdir()
    (tmp_path / "silent" / "metrics.jsonl").write_text('{"step": 1, "split": "train", "time": 0.0}\n')
    (tmp_path / "bad.json").write_text('{"per_episode": [{"seed": 1}]}')
    argv = [arg.format(tmp=tmp_path) for arg in args]
    run = subprocess.run(
        [sys.executable, f"scripts/{script}", *argv],
        cwd=REPO,
        env=_child_env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith("error: " + message.format(tmp=tmp_path))


# -------------------------------------------------------------------------------------------- the interval
def test_the_max_reward_interval_stays_within_the_rewards_bounds(tmp_path):
    from lerobot.episode_stats import aggregate_episodes
    from lerobot.evaluation import clip_reward_interval

    rows = [{"sum_reward": 1.0, "max_reward": r, "success": False} for r in (0.0, 0.58)]
    aggregated = aggregate_episodes(rows, eval_s=1.0, busy_steps=10, slot_steps=10)
    # The normal interval at n=2 leaves [0, 1] (the issue's [-0.278, 0.858]); clipped, it keeps what is inside.
    assert aggregated["avg_max_reward_ci95_low"] == pytest.approx(-0.2784, abs=1e-4)
    clip_reward_interval(aggregated, [0.0, 1.0])
    assert (aggregated["avg_max_reward_ci95_low"], aggregated["avg_max_reward_ci95_high"]) == pytest.approx(
        (0.0, 0.8584), abs=1e-4
    )
    # The evaluation does it with the env's reward_range (PushT: [0, 1]).
    assert (
        eval_main(
            [*RANDOM_EVAL, "eval.n_episodes=2", "eval.max_episodes_rendered=0", "--output-dir", str(tmp_path)]
        )
        == 0
    )
    aggregated = json.loads((tmp_path / "eval_info.json").read_text())["aggregated"]
    assert 0.0 <= aggregated["avg_max_reward_ci95_low"] <= aggregated["avg_max_reward"]
    assert aggregated["avg_max_reward"] <= aggregated["avg_max_reward_ci95_high"] <= 1.0
    assert json.loads((tmp_path / "eval_info.json").read_text())["config"]["env"]["reward_range"] == [
        0.0,
        1.0,
    ]
