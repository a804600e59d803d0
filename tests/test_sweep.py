"""`scripts/train.py -m`: Hydra multirun with the basic and the submitit_local launchers, one run directory
per job, a summary of each job's final metrics, and config errors caught before anything is launched."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_dataset import ZARR, write_fake_zarr
from test_train import TINY

from lerobot.cli import compose_train_config, train_main
from lerobot.cli.sweep import sweep_jobs

REPO = Path(__file__).resolve().parents[1]
JOB = [*TINY, "env=pusht_keypoints", "training.steps=2", "training.save_freq=2", "eval.freq=0"]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def _summary(sweep_dir: Path) -> list[dict]:
    return json.loads((sweep_dir / "summary.json").read_text())["jobs"]


def test_sweep_expands_the_product_of_swept_values():
    jobs = sweep_jobs(["seed=1,2", "policy.optimizer_lr=1e-4,3e-4", "env=pusht"])
    assert len(jobs) == 4
    assert {tuple(j) for j in jobs} == {
        (f"seed={s}", f"policy.optimizer_lr={lr}", "env=pusht") for s in (1, 2) for lr in ("0.0001", "0.0003")
    }


def test_basic_launcher_one_run_dir_per_job_and_a_summary(tmp_path, data_args, capsys):
    sweep = tmp_path / "sweep"
    code = train_main(["-m", *JOB, *data_args, "seed=1,2", f"hydra.sweep.dir={sweep}"])
    assert code == 0
    jobs = _summary(sweep)
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    assert [j["run_dir"] for j in jobs] == [str((sweep / n).resolve()) for n in ("0", "1")]
    for job, seed in zip(jobs, (1, 2)):
        assert f"seed={seed}" in job["overrides"]
        run = Path(job["run_dir"])
        assert (run / "checkpoints" / "000000002" / "model.safetensors").is_file()
        assert job["final"]["train"]["step"] == 2 and job["final"]["train"]["loss"] > 0
    # Different seeds train differently: each job really ran its own config.
    assert jobs[0]["final"]["train"]["loss"] != jobs[1]["final"]["train"]["loss"]
    assert "sweep summary:" in capsys.readouterr().out


def test_config_errors_stop_the_sweep_before_any_job_runs(tmp_path, data_args, capsys):
    sweep = tmp_path / "sweep"
    assert (
        train_main(["-m", *JOB, *data_args, "seed=1,2", "training.nope=3", f"hydra.sweep.dir={sweep}"]) == 2
    )
    assert "nope" in capsys.readouterr().err
    assert not sweep.exists()
    # One directory for every job is refused too.
    assert train_main(["-m", *JOB, *data_args, "seed=1,2", f"output_dir={tmp_path / 'one'}"]) == 2
    assert "hydra.sweep.dir" in capsys.readouterr().err


def test_a_failing_job_is_reported_and_the_others_run(tmp_path, data_args):
    sweep = tmp_path / "sweep"
    roots = f"{data_args[0]},{tmp_path / 'nowhere'}"
    code = train_main(["-m", *JOB, data_args[1], roots, f"hydra.sweep.dir={sweep}"])
    assert code == 2
    jobs = _summary(sweep)
    assert [j["status"] for j in jobs] == ["completed", "error"]
    assert "nowhere" in jobs[1]["error"]


def test_hydra_run_dir_is_the_default_output_dir(tmp_path):
    cfg = compose_train_config(["env=pusht_keypoints", f"hydra.run.dir={tmp_path / 'here'}"])
    assert cfg.output_dir == str(tmp_path / "here")
    cfg = compose_train_config(["env=pusht_keypoints", f"output_dir={tmp_path / 'there'}"])
    assert cfg.output_dir == str(tmp_path / "there")
    # The default pattern names the env and the policy.
    assert compose_train_config(["env=pusht_keypoints"]).output_dir.endswith("_pusht_keypoints_diffusion")


def test_submitit_local_launcher_runs_the_jobs_as_processes(tmp_path, data_args):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        f"hydra.sweep.dir={sweep}",
        *JOB,
        *data_args,
        "seed=1,2",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = _summary(sweep)
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    for job in jobs:
        assert (Path(job["run_dir"]) / "checkpoints" / "000000002" / "model.safetensors").is_file()
    # submitit kept each job's logs (its own process) in the sweep directory.
    assert list((sweep / ".submitit").rglob("*_log.out"))


def test_sigterm_stops_the_sweep_after_a_checkpoint_and_a_relaunch_resumes(tmp_path, data_args):
    sweep = tmp_path / "sweep"
    long_job = [*JOB[:-3], "training.steps=100000", "training.save_freq=100000", "eval.freq=0"]
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), "-m", *long_job, *data_args, "seed=1,2"]
    cmd.append(f"hydra.sweep.dir={sweep}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (sweep / "0" / "metrics.jsonl").exists():
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    jobs = _summary(sweep)
    assert [j["status"] for j in jobs] == ["stopped", "not run"]
    assert (sweep / "0" / "checkpoints" / "last").exists() and not (sweep / "1" / "checkpoints").exists()
    # The same command again resumes job 0 from its checkpoint (training.resume=auto) and runs job 1.
    resumed = [*cmd[:-1], "training.steps=" + str(_step(sweep / "0") + 2), cmd[-1]]
    assert subprocess.run(resumed, env=env, capture_output=True, timeout=300).returncode == 0
    assert [j["status"] for j in _summary(sweep)] == ["completed", "completed"]


def _step(run_dir: Path) -> int:
    return int((run_dir / "checkpoints" / "last").resolve().name)
