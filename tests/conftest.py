"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lerobot.constants import DATA_ROOT_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]

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
def _cache_in_tmp(tmp_path_factory):
    """Tests write only under a temporary directory: conversions and cached measurements included."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    yield
    patch.undo()
