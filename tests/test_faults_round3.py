"""Nothing lost, nothing silent, round three (evaluation, sweeps, config and script faults): each case runs
the real fault where this machine allows it (real signals to real processes, read-only and full file
systems) and the commands as the README and the docs write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dataset import ZARR, write_fake_zarr
from test_train import TINY

from lerobot.cli import train_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


# ------------------------------------------------------------------------------------------------- sweeps
def test_the_readme_sweep_without_a_sweep_dir_writes_its_summary_in_the_default_directory(
    tmp_path, monkeypatch, data_args, capsys
):
    # The README's shape, `scripts/train.py -m <overrides> seed=1,2`, with no hydra.sweep.dir: the default
    # directory (which names the env and the policy) is resolved once, before the jobs run.
    monkeypatch.chdir(tmp_path)
    job = [*TINY, "env=pusht_keypoints", "training.steps=2", "training.save_freq=2", "eval.freq=0"]
    assert train_main(["-m", *job, *data_args, "seed=1,2"]) == 0
    (summary,) = (tmp_path / "outputs" / "multirun").glob("*/*_pusht_keypoints_diffusion/summary.json")
    jobs = json.loads(summary.read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    assert [j["run_dir"] for j in jobs] == [str(summary.parent / n) for n in ("0", "1")]
    assert all(j["final"]["train"]["step"] == 2 for j in jobs)
    out = capsys.readouterr().out
    assert f"sweep summary: {summary.relative_to(tmp_path)}" in out
