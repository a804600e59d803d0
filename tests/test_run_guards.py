"""Run guards reproduced for real: a deleted `run.lock` under a live run, temporaries of a writer killed in a
PID namespace, checkpoint bytes across processes, a deleted `checksums.json`, the free-space estimate on a
real full filesystem, and a full file size limit while appending `metrics.jsonl`."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_checkpoint_faults import (
    _save_and_hang,
    as_older_version,
    one_line_error,
    save_and_kill,
    tiny_checkpoint,
)
from test_online_train import TINY as TINY_TDMPC
from test_run_lifecycle import diffusion_args, launch, train_steps, wait_for
from test_train import TINY, data_args  # noqa: F401 (data_args: a pytest fixture)

import lerobot.checkpoints.run_writer as run_writer
from lerobot.checkpoints.run import load_config, load_run_policy, load_training_state
from lerobot.checkpoints.run_layout import MODEL_FILE, checkpoint_dir, latest_checkpoint
from lerobot.cli import eval_main, train_main
from lerobot.errors import CheckpointError, RunDirError
from lerobot.runtime.checksums import CHECKSUMS_FILE
from lerobot.training.run_dir.cleanup import remove_stale_temporaries
from lerobot.training.run_dir.lock import LOCK_FILE, RunLock

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this one's (its temporary cache included), the repository
    importable."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def train_process(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`scripts/train.py args` run to its end in a new process."""
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/train.py"), *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# ------------------------------------------------------------------- 1: one writer, even without run.lock
# The first checkpoint save of the run waits for the file `go` (after saying so in `saving`), so that the
# test acts while the run is alive and busy.
PAUSED_SAVE = textwrap.dedent(
    """
    import pathlib, time, torch
    real_save = torch.save
    def paused_save(obj, f, *a, **k):
        path = pathlib.Path(getattr(f, "name", str(f)))
        run = path.parents[2]
        if path.parent.name.startswith(".tmp-") and not (run / "go").exists():
            (run / "saving").write_text(path.parent.name)
            while not (run / "go").exists():
                time.sleep(0.05)
        return real_save(obj, f, *a, **k)
    torch.save = paused_save
    """
)


def test_deleting_run_lock_does_not_let_a_second_run_in(tmp_path, data_args):  # noqa: F811
    run = tmp_path / "run"
    args = [*diffusion_args(data_args, run), "training.steps=6", "training.save_freq=3", "eval.freq=0"]
    first = launch(args, prelude=PAUSED_SAVE)
    try:
        wait_for(lambda: (run / "saving").exists(), first)  # inside the save of step 3
        (run / LOCK_FILE).unlink()
        second = train_process(args)
    finally:
        (run / "go").touch()
    _, first_err = first.communicate(timeout=300)

    errors = error_lines(second.stderr)
    assert second.returncode == 2 and len(errors) == 1, second.stderr[-3000:]
    assert f"{run} is in use by another training run (pid={first.pid} " in errors[0], errors[0]
    assert first.returncode == 0 and "Traceback" not in first_err, first_err[-3000:]
    assert f"{run / LOCK_FILE} was deleted" in first_err  # rewritten by its owner before the next save
    assert train_steps(run) == [1, 2, 3, 4, 5, 6]  # one trajectory: nothing of a second run
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000003", "000000006", "last"]
    assert latest_checkpoint(run) == checkpoint_dir(run, 6)
    assert (run / LOCK_FILE).read_text() == ""  # the owner record exists again and was emptied at the end


def test_the_owner_rewrites_run_lock_and_stops_when_its_directory_is_replaced(tmp_path):
    run = tmp_path / "run"
    owner = RunLock(run)
    owner.acquire()
    try:
        tiny_checkpoint(run, 1, lock=owner)
        (run / LOCK_FILE).unlink()
        tiny_checkpoint(run, 2, lock=owner)  # verified before writing: the record is rewritten
        assert (run / LOCK_FILE).read_text().startswith(f"pid={os.getpid()} ")
        # The directory is moved away and a new one made in its place (which another run could lock).
        run.rename(tmp_path / "moved")
        run.mkdir()
        with pytest.raises(RunDirError, match=f"{run} is no longer the directory this run locked"):
            tiny_checkpoint(run, 3, lock=owner)
        assert list(run.iterdir()) == []
    finally:
        owner.release()


def test_a_save_behind_last_is_refused(tmp_path):
    """`last` points at a later step than the one being saved: another writer got there first."""
    run = tmp_path / "run"
    tiny_checkpoint(run, 5)
    with pytest.raises(RunDirError, match="not saving checkpoint 000000003: .*last points at 000000005"):
        tiny_checkpoint(run, 3)
    assert latest_checkpoint(run) == checkpoint_dir(run, 5)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000005", "last"]


def _sleep(ready) -> None:
    ready.set()
    time.sleep(600)


def test_forked_children_do_not_hold_the_lock(tmp_path):
    """A loader or env worker forked by the owner does not keep the run directory locked after it."""
    run = tmp_path / "run"
    owner = RunLock(run)
    owner.acquire()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_sleep, args=(ready,))
    child.start()
    try:
        assert ready.wait(60)
        owner.release()
        lock = RunLock(run)
        lock.acquire()  # the child still lives
        lock.release()
    finally:
        child.kill()
        child.join()


# ------------------------------------------------------------ 2: stale temporaries, whatever their names say
def start_hanging_save(run: Path, step: int, where: str) -> multiprocessing.Process:
    """A real child process hanging inside the save of checkpoint `step` (see `_save_and_hang`)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_save_and_hang, args=(run, step, where, ready))
    child.start()
    assert ready.wait(120), "the child never reached the point where it hangs"
    return child


def claim_pid(tmp: Path, pid: int) -> Path:
    """Rename a temporary so that its name names `pid` as its writer (as a container's PID 1 would)."""
    return tmp.rename(tmp.with_name(f"{tmp.name.rpartition('@')[0]}@{pid}"))


def test_a_temporary_is_stale_when_its_writer_is_dead_whatever_pid_its_name_holds(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    ckpts = run / "checkpoints"
    writer = start_hanging_save(run, 2, "checksums")
    try:
        (tmp,) = ckpts.glob(".tmp-*")
        gone = subprocess.Popen(["true"])
        gone.wait()
        tmp = claim_pid(tmp, gone.pid)  # a pid that no process has
        remove_stale_temporaries(run)
        assert tmp.exists()  # its writer lives: kept
    finally:
        writer.kill()
        writer.join()
    tmp = claim_pid(tmp, os.getpid())  # a pid that is alive: this process's
    remove_stale_temporaries(run)
    assert not tmp.exists()
    assert sorted(p.name for p in ckpts.iterdir()) == ["000000001", "last"]


def test_a_complete_temporary_of_a_killed_writer_is_recovered_whatever_pid_its_name_holds(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    save_and_kill(run, 1, "rename")  # the old copy is aside, the new one complete: checkpoint 1 is missing
    ckpts = run / "checkpoints"
    for tmp in ckpts.glob(".tmp-*"):
        claim_pid(tmp, os.getpid())
    remove_stale_temporaries(run)
    assert sorted(p.name for p in ckpts.iterdir()) == ["000000001", "last"]
    assert load_training_state(checkpoint_dir(run, 1))["step"] == 1


UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _namespaces_work(*flags: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", *flags, "true"], capture_output=True)
    return probe.returncode == 0


HANG_AS_PID_1 = """
import os, pathlib, sys
sys.path[:0] = [{tests!r}]
from test_checkpoint_faults import _save_and_hang
class Ready:
    def set(self):
        print("ready", os.getpid(), flush=True)
_save_and_hang(pathlib.Path({run!r}), 2, "checksums", Ready())
"""
CLEAN_AS_PID_1 = """
import os, pathlib
from lerobot.training.run_dir.cleanup import remove_stale_temporaries
assert os.getpid() == 1
remove_stale_temporaries(pathlib.Path({run!r}))
"""


def wait_until_dead(pid: int, timeout: float = 30.0) -> None:
    """Wait until process `pid` has exited (gone, or a zombie, which holds no file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not die")


@pytest.mark.skipif(
    not _namespaces_work("--user", "--map-root-user", "--pid", "--fork", "--mount-proc"),
    reason="needs unprivileged user and PID namespaces (unshare)",
)
def test_a_trainer_as_pid_1_removes_what_a_killed_pid_1_writer_left(tmp_path):
    """Both the killed writer and the next trainer are PID 1 of their own PID namespace (a container)."""
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    writer = subprocess.Popen(
        [*UNSHARE, sys.executable, "-c", HANG_AS_PID_1.format(tests=str(TESTS), run=str(run))],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().split() == ["ready", "1"]
        children = Path(f"/proc/{writer.pid}/task/{writer.pid}/children")
        if not children.exists():
            pytest.skip("the kernel does not list a process's children (/proc/PID/task/TID/children)")
        (inner,) = children.read_text().split()  # the writer's pid outside its namespace
    finally:
        writer.kill()  # unshare's SIGKILL reaches its child (--kill-child): the writer dies without clean-up
        writer.wait()
    wait_until_dead(int(inner))
    (tmp,) = (run / "checkpoints").glob(".tmp-*")
    assert tmp.name.endswith("@1")
    cleaner = subprocess.run(
        [*UNSHARE, sys.executable, "-c", CLEAN_AS_PID_1.format(run=str(run))],
        env=child_env(),
        capture_output=True,
    )
    assert cleaner.returncode == 0, cleaner.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000001", "last"]


# --------------------------------------------------------------------- 3: the same bytes for the same weights
SAVE_SAME_STATE = """
import pathlib, sys, torch
sys.path[:0] = [{tests!r}]
from test_checkpoint_faults import tiny_checkpoint
out = pathlib.Path({out!r})
torch.manual_seed(0)
tiny_checkpoint(out / "run", 1)
torch.manual_seed(0)
tiny_checkpoint(out / "run", 2)
from lerobot.checkpoints import from_pretrained, save_pretrained
save_pretrained(from_pretrained(out / "run"), out / "pretrained")
"""


def test_model_files_are_byte_identical_across_processes(tmp_path):
    for seed in ("1", "2"):
        code = SAVE_SAME_STATE.format(tests=str(TESTS), out=str(tmp_path / seed))
        env = child_env(PYTHONHASHSEED=seed)
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
    checkpoints = [tmp_path / s / "run/checkpoints" / f"{n:09d}" / MODEL_FILE for s in "12" for n in (1, 2)]
    assert len({p.read_bytes() for p in checkpoints}) == 1
    pretrained = [tmp_path / s / "pretrained" / MODEL_FILE for s in "12"]
    assert len({p.read_bytes() for p in pretrained}) == 1
    recorded = {
        json.loads(p.with_name(CHECKSUMS_FILE).read_text())["sha256"][MODEL_FILE] for p in checkpoints
    }
    assert len(recorded) == 1
    # The header lists the metadata keys sorted, and reads back: same tensors as the pretrained copy.
    raw = checkpoints[0].read_bytes()
    metadata = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
    assert list(metadata) == sorted(metadata) and "lerobot.policy" in metadata
    a, b = load_file(checkpoints[0]), load_file(pretrained[0])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -------------------------------------------------------------------------- 4: a deleted checksums.json
def test_a_deleted_checksums_file_is_an_error_when_the_checkpoint_recorded_it(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "run", 1)
    (ckpt / CHECKSUMS_FILE).unlink()
    assert eval_main(["--checkpoint", str(ckpt)]) == 2
    err = one_line_error(capsys)
    assert f"{ckpt} was saved with checksums but {ckpt / CHECKSUMS_FILE} is missing" in err, err
    assert "write_checksums" in err
    for load in (load_config, load_training_state, load_run_policy):
        with pytest.raises(CheckpointError, match=f"{CHECKSUMS_FILE} is missing"):
            load(ckpt)


def test_an_older_checkpoint_without_checksums_loads_with_a_warning(tmp_path, caplog):
    ckpt = tiny_checkpoint(tmp_path / "run", 1)
    as_older_version(ckpt)
    with caplog.at_level("WARNING"):
        policy, _ = load_run_policy(ckpt)
        assert load_training_state(ckpt)["step"] == 1
    assert f"{MODEL_FILE} has no recorded checksum" in caplog.text


# ------------------------------------------------------------------ 5: the free-space estimate is an upper bound
def on_disk(ckpt: Path) -> int:
    """Bytes the checkpoint directory takes on its filesystem (allocated blocks, the directory's own too)."""
    return sum(p.stat().st_blocks * 512 for p in [ckpt, *ckpt.rglob("*")])


@pytest.mark.parametrize("config", ["diffusion", "tdmpc"])
def test_the_space_estimate_covers_what_a_save_writes(config, tmp_path, data_args, monkeypatch):  # noqa: F811
    estimates = []
    real = run_writer.checkpoint_bytes

    def record(*args, **kwargs):
        estimates.append(real(*args, **kwargs))
        return estimates[-1]

    monkeypatch.setattr(run_writer, "checkpoint_bytes", record)
    run = tmp_path / "run"
    if config == "diffusion":
        args = [*TINY, "env=pusht_keypoints", *data_args, "training.steps=2", "training.save_freq=2"]
    else:
        args = [*TINY_TDMPC, "training.steps=20"]
    assert train_main([*args, "eval.freq=0", f"output_dir={run}"]) == 0
    ckpt = latest_checkpoint(run)
    written = sum(p.stat().st_size for p in ckpt.rglob("*"))
    print(f"{config}: estimate {estimates[-1]}, written {written}, on disk {on_disk(ckpt)}")
    assert len(estimates) == 1 and written <= on_disk(ckpt) <= estimates[0] <= 1.25 * on_disk(ckpt)


FILL_TO_ESTIMATE = """
import os, pathlib, shutil, sys
sys.path[:0] = [{tests!r}]
import lerobot.checkpoints.run_writer as run_writer
from lerobot.errors import CheckpointError
from test_checkpoint_faults import tiny_checkpoint
mnt = pathlib.Path({mnt!r})
os.system(f"mount -t tmpfs -o size=8m tmpfs {{mnt}}")
real = run_writer.checkpoint_bytes

def fill(*args, **kwargs):
    # Leave exactly the estimate free (less `short` bytes), as a disk filled by other writers would.
    needed = real(*args, **kwargs)
    with open(mnt / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(mnt).free - needed + {short})
    assert shutil.disk_usage(mnt).free == needed - {short}
    return needed

run_writer.checkpoint_bytes = fill
try:
    tiny_checkpoint(mnt / "run", 1)
    print("saved")
except CheckpointError as e:
    print(e)
"""


@pytest.mark.skipif(
    not _namespaces_work("--user", "--map-root-user", "--mount"),
    reason="needs unprivileged user and mount namespaces (unshare) to mount a small tmpfs",
)
def test_a_real_full_filesystem_with_exactly_the_estimate_free(tmp_path):
    for short, expected in ((0, "saved"), (4096, "no space left on device; it needs about")):
        mnt = tmp_path / f"mnt{short}"
        mnt.mkdir()
        code = FILL_TO_ESTIMATE.format(tests=str(TESTS), mnt=str(mnt), short=short)
        result = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", code],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert expected in result.stdout, result.stdout


# ---------------------------------------------------------------------- 6: a full file size limit in metrics.jsonl
def test_a_full_file_size_limit_while_appending_metrics_names_the_file(tmp_path, data_args):  # noqa: F811
    run = tmp_path / "run"
    args = [*diffusion_args(data_args, run), "training.save_freq=2", "eval.freq=0"]
    assert train_main([*args, "training.steps=2"]) == 0
    # The metrics file has grown to just under the file size limit (a 1.4 MB training state fits under it).
    path = run / "metrics.jsonl"
    limit = 2_000_000
    pad = {"step": 0, "split": "notes", "text": ""}
    pad["text"] = "x" * (limit - 60 - path.stat().st_size - len(json.dumps(pad)) - 1)
    path.write_text(json.dumps(pad) + "\n" + path.read_text())
    before = path.read_bytes()

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = train_process([*args, "training.steps=4", "training.resume=true"], preexec_fn=limit_file_size)
    errors = error_lines(result.stderr)
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"error: File too large writing {path}: "), errors[0]
    assert "file size limit" in errors[0]
    assert path.read_bytes() == before  # no half-written line was left behind
