"""A resumed run trains on the data its checkpoint was trained on: each checkpoint records the data's
fingerprint, a relaunch on other data stops with one line naming both (unless training.allow_other_data=true),
and checkpoints saved before fingerprints existed resume as they always did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_dataset import ZARR, write_fake_zarr
from test_online_train import TINY as TINY_TDMPC
from test_run_lifecycle import train_steps
from test_train import TINY

from lerobot.checkpoints.run_layout import DATA_FINGERPRINT_FILE, latest_checkpoint, list_checkpoints
from lerobot.cli import train_main
from lerobot.runtime.checksums import write_checksums

# (episode lengths, seed) of the two datasets: "run" is the one the run starts on, "other" replaces it.
RUN_DATA = ([20, 25, 18, 30], 0)  # 4 episodes, 93 frames
OTHER_DATA = ([20, 25, 18], 1)  # 3 episodes, 63 frames


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """Directories holding a fake PushT zarr each: `run`, `moved` (the same data elsewhere) and `other`."""
    base = tmp_path_factory.mktemp("roots")
    write_fake_zarr(base / "run" / ZARR, lengths=RUN_DATA[0], seed=RUN_DATA[1])
    shutil.copytree(base / "run", base / "moved")
    write_fake_zarr(base / "other" / ZARR, lengths=OTHER_DATA[0], seed=OTHER_DATA[1])
    return {name: base / name for name in ("run", "moved", "other")}


def offline_args(run: Path, root: Path, steps: int, *extra: str) -> list[str]:
    cache = run.parent / "cache"
    data = [f"dataset.root={root}", f"dataset.cache_dir={cache}"]
    return [
        *TINY,
        "env=pusht_keypoints",
        *data,
        f"training.steps={steps}",
        "eval.freq=0",
        f"output_dir={run}",
        *extra,
    ]


def fingerprint(run: Path) -> dict:
    return json.loads((latest_checkpoint(run) / DATA_FINGERPRINT_FILE).read_text())


def one_line(capsys) -> str:
    """The error the last command ended with: one line, no traceback (progress bars may come before it)."""
    err = capsys.readouterr().err
    errors = [line.strip() for line in err.splitlines() if line.strip().startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err and err.strip().endswith(errors[0]), err
    return errors[0]


def test_resume_on_other_data_is_refused_unless_allowed(tmp_path, roots, capsys):
    run = tmp_path / "run"
    assert train_main(offline_args(run, roots["run"], 2)) == 0
    recorded = fingerprint(run)
    assert (recorded["format"], recorded["episodes"], recorded["frames"]) == ("pusht_zarr", 4, 93)
    assert len(recorded["sha256"]) == 64 and recorded["source"] == str(roots["run"] / ZARR)

    # The issue: a zarr with fewer episodes used to resume with the checkpoint's statistics and no word.
    assert train_main(offline_args(run, roots["other"], 3)) == 2
    err = one_line(capsys)
    assert f"{run} holds a run trained on other data" in err, err
    assert "4 episodes, 93 frames" in err and "3 episodes, 63 frames" in err, err
    assert "training.allow_other_data=true" in err and "another output_dir" in err, err
    assert train_steps(run) == [1, 2] and [p.name for p in list_checkpoints(run)] == ["000000002"]

    # The same data in another directory is the same data (dataset.root may change on resume).
    assert train_main(offline_args(run, roots["moved"], 3)) == 0
    assert train_steps(run) == [1, 2, 3] and fingerprint(run)["sha256"] == recorded["sha256"]

    # Asked for: the run goes on with the new data, and its checkpoints record it from then on.
    assert train_main(offline_args(run, roots["other"], 4, "training.allow_other_data=true")) == 0
    assert train_steps(run) == [1, 2, 3, 4]
    assert (fingerprint(run)["episodes"], fingerprint(run)["frames"]) == (3, 63)
    assert train_main(offline_args(run, roots["other"], 5)) == 0  # its data now: no override needed
    assert train_steps(run) == [1, 2, 3, 4, 5]


def test_checkpoint_without_a_fingerprint_resumes_as_before(tmp_path, roots):
    """A checkpoint saved before checkpoints recorded their data resumes unchecked, even on other data."""
    run = tmp_path / "run"
    assert train_main(offline_args(run, roots["run"], 2)) == 0
    old = latest_checkpoint(run)
    (old / DATA_FINGERPRINT_FILE).unlink()
    (old / "checksums.json").unlink()
    write_checksums(old)  # as an older version wrote it: no fingerprint file, checksums of the rest
    assert train_main(offline_args(run, roots["other"], 3)) == 0
    assert train_steps(run) == [1, 2, 3]
    assert fingerprint(run)["episodes"] == 3  # the new checkpoint records what it was trained on


def test_allow_other_data_is_validated_at_start(tmp_path, roots, capsys):
    assert train_main(offline_args(tmp_path / "run", roots["run"], 2, "training.allow_other_data=maybe")) == 2
    assert "training.allow_other_data" in one_line(capsys)
    assert not (tmp_path / "run").exists()


def test_online_run_with_demonstrations_checks_them_too(tmp_path, roots, capsys):
    """TD-MPC with training.offline_ratio > 0 mixes demonstrations into its batches: they are checked alike;
    without them (offline_ratio=0) a checkpoint records no data."""
    run = tmp_path / "run"
    tdmpc = [o for o in TINY_TDMPC if not o.startswith("env")]
    tdmpc += ["env=pusht_keypoints", "env.max_episode_steps=10", "training.offline_ratio=0.5", "eval.freq=0"]
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"

    def args(root: Path, steps: int) -> list[str]:
        return [*tdmpc, f"dataset.root={root}", cache, f"training.steps={steps}", f"output_dir={run}"]

    assert train_main(args(roots["run"], 20)) == 0
    assert (fingerprint(run)["episodes"], fingerprint(run)["frames"]) == (4, 93)
    assert train_main(args(roots["other"], 40)) == 2
    err = one_line(capsys)
    assert (
        "trained on other data" in err and "4 episodes, 93 frames" in err and "3 episodes, 63 frames" in err
    )
    assert train_main(args(roots["run"], 40)) == 0
    assert latest_checkpoint(run).name == "000000040"

    online_only = tmp_path / "online_only"
    argv = [*TINY_TDMPC, "training.steps=20", f"output_dir={online_only}"]
    assert train_main(argv) == 0
    assert not (latest_checkpoint(online_only) / DATA_FINGERPRINT_FILE).exists()
