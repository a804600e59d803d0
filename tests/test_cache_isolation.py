"""The suite never writes into the user's `~/.cache/lerobot`: caches point into a session temp directory, and
any write there from the test process is refused (conftest's audit hook)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import USER_CACHES, in_user_cache

from lerobot.config import DatasetConfig
from lerobot.datasets import default_cache_dir
from lerobot.datasets.pusht_import import pusht_cache_dir


def test_cache_dirs_point_into_the_session_tmp(tmp_path_factory):
    base = str(tmp_path_factory.getbasetemp().resolve())
    for cache in (default_cache_dir(), pusht_cache_dir(DatasetConfig())):
        assert str(cache.resolve()).startswith(base) and not in_user_cache(cache)
    # Child processes (CLI tests, spawned workers) inherit the redirection.
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['XDG_CACHE_HOME'])"],
        capture_output=True,
        text=True,
    )
    assert child.stdout.strip() == os.environ["XDG_CACHE_HOME"] and child.stdout.startswith(base)


@pytest.mark.parametrize("cache", USER_CACHES)
def test_writes_into_the_user_cache_are_refused(cache):
    # The parent directory does not exist, so even without the guard nothing could be created there.
    target = Path(cache) / "no-such-dir-for-tests" / "file.json"
    with pytest.raises(PermissionError, match="a test wrote into the user's cache"):
        target.write_text("{}")
    with pytest.raises(PermissionError, match="a test wrote into the user's cache"):
        os.open(target, os.O_WRONLY | os.O_CREAT)
    with pytest.raises(PermissionError, match="a test wrote into the user's cache"):
        os.rename(target.with_name("a"), target)
    with pytest.raises(FileNotFoundError):  # reading is allowed
        target.read_text()
