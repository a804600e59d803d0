"""An export killed halfway leaves its temporary directory; the next export into the same `--out` removes it,
and never the temporary of an export still running, whatever PID namespace either runs in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_dataset import ZARR, write_fake_zarr

from lerobot.runtime.files import (
    UNLOCKED_GRACE_S,
    WRITER_LOCK_FILE,
    TemporaryDir,
    remove_stale_temporary_dirs,
    temporary_prefix,
    writer_is_alive,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run before scripts/export_dataset.py in the killed process: the export stops for good when it reaches the
# videos (its data parquet written, its temporary locked) and says so in a marker file.
PAUSE_AT_VIDEOS = """
import time
from pathlib import Path
import lerobot.datasets.lerobot_export as export

def encode_video(path, *args, **kwargs):
    Path({marker!r}).write_text(str(path))
    time.sleep(3600)

export.encode_video = encode_video
"""


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> list[str]:
    """`dataset.*` settings of a small fake PushT zarr (with images, so that the export encodes videos)."""
    base = tmp_path_factory.mktemp("export_source")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def export_command(out: Path, source: list[str], prelude: str = "") -> list[str]:
    """`python scripts/export_dataset.py --out OUT dataset.*=...`, after `prelude` when one is given."""
    args = ["--out", str(out), *source]
    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['export_dataset.py', *{args!r}]\n"
    code += "runpy.run_path('scripts/export_dataset.py', run_name='__main__')"
    return [sys.executable, "-c", code]


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}


def temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{temporary_prefix(out)}*"))


@pytest.mark.parametrize("namespace", ["same", "pid_namespace"])
def test_killed_export_leaves_a_temporary_that_the_next_export_removes(tmp_path, source, namespace):
    if namespace == "pid_namespace" and not _unshare_works():
        pytest.skip("unshare --pid is not available here")
    out, marker = tmp_path / "pusht_lerobot", tmp_path / "encoding"
    command = export_command(out, source, PAUSE_AT_VIDEOS.format(marker=str(marker)))
    if namespace == "pid_namespace":  # the exporter is pid 1 of a namespace of its own
        command = ["unshare", "--pid", "--fork", *command]
    proc = subprocess.Popen(
        command, cwd=REPO_ROOT, env=run_env(), stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"the export ended early ({proc.returncode}): {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the export did not reach its videos in time"
            time.sleep(0.05)
        (tmp,) = temporaries(out)
        assert list(tmp.glob("data/chunk-000/*.parquet")) and (tmp / WRITER_LOCK_FILE).exists()
        # A running export's temporary is left alone by a second export's clean-up.
        assert writer_is_alive(tmp) and remove_stale_temporary_dirs(out) == (0, 0) and tmp.is_dir()
        if namespace == "pid_namespace":
            # Named after pid 1 of its namespace, which is alive here too (init): the pid in a name proves
            # nothing across namespaces, the writer's lock does.
            pid = int(tmp.name[len(temporary_prefix(out)) :].split("-")[0])
            assert pid == 1 and os.path.exists(f"/proc/{pid}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    # The kernel drops the lock once the killed writer has exited (in a PID namespace, a moment after
    # `unshare` itself has).
    deadline = time.monotonic() + 10
    while writer_is_alive(tmp) and time.monotonic() < deadline:
        time.sleep(0.01)
    # The issue: what SIGKILL leaves stays; it used to stay forever, re-exports notwithstanding.
    assert temporaries(out) == [tmp] and not writer_is_alive(tmp)
    result = subprocess.run(
        export_command(out, source), cwd=REPO_ROOT, env=run_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "removed 1 unfinished export(s)" in result.stderr and str(out) in result.stderr
    assert temporaries(out) == [] and (out / "meta" / "info.json").is_file()
    assert not (out / WRITER_LOCK_FILE).exists()  # the lock file is no part of the export


def test_stale_temporaries_are_told_by_their_lock_not_their_pid(tmp_path):
    out = tmp_path / "out"
    prefix = temporary_prefix(out)
    # Named after a live process (this one) but not locked: a writer killed between making and locking it,
    # or an export from before the lock. Left alone for UNLOCKED_GRACE_S after its last change, then removed.
    unlocked = tmp_path / f"{prefix}{os.getpid()}-0000"
    unlocked.mkdir()
    (unlocked / "part.bin").write_bytes(b"x" * 1000)
    assert writer_is_alive(unlocked) and remove_stale_temporary_dirs(out) == (0, 0)
    old = time.time() - UNLOCKED_GRACE_S - 1
    os.utime(unlocked, (old, old))
    # Locked by this process: alive, however old.
    with TemporaryDir(out) as writing:
        os.utime(writing.path, (old, old))
        assert remove_stale_temporary_dirs(out) == (1, 1000) and not unlocked.exists()
        assert writing.path.is_dir() and writer_is_alive(writing.path)
        (writing.path / "meta.json").write_text("{}")
        writing.install()
    assert sorted(p.name for p in out.iterdir()) == ["meta.json"] and temporaries(out) == []


def test_temporary_dir_left_by_an_error_is_removed(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), TemporaryDir(out) as writing:
        (writing.path / "half").write_text("written")
        raise RuntimeError("failed halfway")
    assert list(tmp_path.iterdir()) == []
