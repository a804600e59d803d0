"""Nothing run from a file someone hands you: a crafted `training_state.pt` (its checksum rewritten to match)
is refused by every command that reads it, and an older checkpoint is converted only on the user's word."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoint_faults import one_line_error
from test_dataset import ZARR, write_fake_zarr
from test_train import TINY

from lerobot.checkpoints.run import load_training_state
from lerobot.checkpoints.run_layout import checkpoint_dir
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE
from lerobot.cli import convert_main, eval_main, train_main
from lerobot.runtime.checksums import file_sha256, read_checksums, write_checksums

REPO = Path(__file__).resolve().parents[1]
KEYPOINTS = [*TINY, "env=pusht_keypoints", "training.save_freq=2", "eval.freq=0"]


class _Payload:
    """Unpickling this runs `touch MARKER`, as a crafted checkpoint would run any command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def _trained_run(run: Path, data_args: list[str]) -> Path:
    assert train_main([*KEYPOINTS, *data_args, "training.steps=2", f"output_dir={run}"]) == 0
    return checkpoint_dir(run, 2)


def _rewrite_state(ckpt: Path, change) -> None:
    """Apply `change` to the checkpoint's training state as an attacker (or an older version) would write it,
    and record the new file's checksum so that the checksums vouch for it."""
    state = torch.load(ckpt / TRAINING_STATE_FILE, weights_only=False)
    change(state)
    torch.save(state, ckpt / TRAINING_STATE_FILE)
    write_checksums(ckpt)


def test_a_crafted_training_state_runs_nothing_on_resume_branch_or_raw_weights(tmp_path, data_args, capsys):
    ckpt = _trained_run(tmp_path / "run", data_args)
    marker = tmp_path / "pwned"
    _rewrite_state(ckpt, lambda state: state.__setitem__("extras", _Payload(marker)))
    # The payload is real: an unsafe load runs it (in a child process, so this one stays clean).
    unsafe = f"import torch; torch.load({str(ckpt / TRAINING_STATE_FILE)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", unsafe], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert marker.exists()
    marker.unlink()
    capsys.readouterr()

    launches = {
        "resume": lambda: train_main(
            [
                *KEYPOINTS,
                *data_args,
                "training.steps=4",
                "training.resume=true",
                f"output_dir={tmp_path / 'run'}",
            ]
        ),
        "init_from": lambda: train_main(
            [
                *KEYPOINTS,
                *data_args,
                "training.steps=4",
                f"training.init_from={ckpt}",
                f"output_dir={tmp_path / 'b'}",
            ]
        ),
        "raw weights": lambda: eval_main(["--checkpoint", str(ckpt), "--raw-weights", "eval.n_episodes=2"]),
    }
    for name, launch in launches.items():
        assert launch() == 2, name
        err = one_line_error(capsys)
        assert "holds objects that a safe load does not run" in err and "posix.system" in err, (name, err)
        assert "--trust-pickle" in err and str(ckpt) in err, err
        assert not marker.exists(), f"{name} ran the checkpoint's code"
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_an_older_checkpoint_is_refused_in_one_line_and_converted_only_on_the_users_word(
    tmp_path, data_args, capsys
):
    run = tmp_path / "run"
    ckpt = _trained_run(run, data_args)
    np.random.seed(7)
    legacy = np.random.get_state()  # how versions before the safe load stored numpy's random state

    def as_older_version(state: dict) -> None:
        state["rng"]["numpy"] = legacy

    _rewrite_state(ckpt, as_older_version)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ckpt / TRAINING_STATE_FILE, weights_only=True)
    before = file_sha256(ckpt / TRAINING_STATE_FILE)
    capsys.readouterr()

    resume = [*KEYPOINTS, *data_args, "training.steps=4", "training.resume=true", f"output_dir={run}"]
    assert train_main(resume) == 2
    err = one_line_error(capsys)
    assert "numpy" in err and f"convert_checkpoint.py {ckpt} --trust-pickle" in err, err

    assert convert_main([str(run)]) == 2  # without the user's word nothing is unpickled or changed
    assert "--trust-pickle only if you made these checkpoints" in one_line_error(capsys)
    assert file_sha256(ckpt / TRAINING_STATE_FILE) == before

    assert convert_main([str(run), "--trust-pickle"]) == 0
    assert f"{ckpt}: converted" in capsys.readouterr().out
    assert read_checksums(ckpt)[TRAINING_STATE_FILE] == file_sha256(ckpt / TRAINING_STATE_FILE)
    saved = load_training_state(ckpt)["rng"]["numpy"]  # a safe load now reads it, with the same state
    assert saved["pos"] == legacy[2] and np.array_equal(saved["key"].numpy().astype(np.uint32), legacy[1])
    assert convert_main([str(ckpt), "--trust-pickle"]) == 0
    assert "already loads safely" in capsys.readouterr().out
    assert train_main(resume) == 0
    assert load_training_state(checkpoint_dir(run, 4))["step"] == 4


def test_a_resumed_run_draws_the_random_numbers_it_would_have_drawn(tmp_path, data_args):
    """The random states saved as plain tensors restore numpy's stream exactly."""
    from lerobot import random_state

    np.random.seed(3)
    state = random_state.get_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = np.random.rand(5)
    np.random.seed(0)
    random_state.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert np.array_equal(np.random.rand(5), expected)
