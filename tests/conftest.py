"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from lerobot.config import RECIPE_ENV
from lerobot.constants import DATA_ROOT_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]

# The user's own cache, wherever it is (before `_cache_in_tmp` points XDG_CACHE_HOME elsewhere). Nothing the
# suite does in this process may write there: `_refuse_user_cache_writes` turns such a write into an error.
_HOME_CACHE = str(Path.home() / ".cache")
USER_CACHES = tuple(
    os.path.abspath(os.path.join(base, "lerobot"))
    for base in dict.fromkeys([os.environ.get("XDG_CACHE_HOME") or _HOME_CACHE, _HOME_CACHE])
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# Audit events that change the file system, with the positions of their path arguments.
_FS_EVENTS = {
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.truncate": (0,),
    "os.symlink": (1,),
    "os.link": (1,),
    "os.utime": (0,),
    "os.chmod": (0,),
    "shutil.rmtree": (0,),
}


def in_user_cache(path: object) -> bool:
    """Whether `path` (str, bytes or path-like; file descriptors are not paths) lies in the user's cache."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    resolved = os.path.abspath(os.fsdecode(path))
    return any(resolved == cache or resolved.startswith(cache + os.sep) for cache in USER_CACHES)


def _refuse_user_cache_writes(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        paths = (path,) if writing else ()
    else:
        paths = tuple(args[i] for i in _FS_EVENTS.get(event, ()))
    for path in paths:
        if in_user_cache(path):
            raise PermissionError(
                f"a test wrote into the user's cache ({event} {path}); write under tmp_path"
            )


sys.addaudithook(_refuse_user_cache_writes)

# The suite must stay fast on 2 cores; several torch threads fighting over them only slows it down.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pusht_data_root() -> Path:
    """Directory holding `pusht_cchi_v7_replay.zarr`, from $LEROBOT_DATA_ROOT or `../shared/data/pusht`.

    In CI (CI=true) a missing copy fails the test with instructions; elsewhere the test is skipped.
    """
    candidates = [os.environ.get(DATA_ROOT_ENV), REPO_ROOT.parent / "shared" / "data" / "pusht"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "pusht_cchi_v7_replay.zarr").is_dir():
            return Path(candidate)
    message = (
        f"PushT demonstrations not found: set {DATA_ROOT_ENV} to the directory holding "
        "pusht_cchi_v7_replay.zarr (e.g. ../shared/data/pusht)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session", autouse=True)
def _paper_recipe():
    """The suite's runs are written against the policies' own defaults, which `recipe=auto` would replace on
    this CPU by the CPU recipe of the policy and env (lerobot/cli/recipes.py); tests of that rule pass
    `recipe=` themselves. Subprocesses (torchrun, scripts) inherit it."""
    patch = pytest.MonkeyPatch()
    patch.setenv(RECIPE_ENV, "paper")
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_raises():
    """Ctrl-C's default action in the suite and in the scripts it starts, however it was launched: a shell's
    background job (`pytest &`) ignores SIGINT, which its children inherit, and Python then installs no
    KeyboardInterrupt handler, so the tests that send SIGINT would see it ignored."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session", autouse=True)
def _cache_in_tmp(tmp_path_factory):
    """Tests write only under a temporary directory: conversions and cached measurements included."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    yield
    patch.undo()
