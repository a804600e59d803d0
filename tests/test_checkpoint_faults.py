"""Checkpoint faults reproduced for real: killed saves, dangling links, flipped bytes, divergence, features or
architecture that do not fit, empty configs, a full disk (RLIMIT_FSIZE) and the user's umask."""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_diffusion import stats_for
from test_train import TINY, TINY_IMAGE, data_args  # noqa: F401 (data_args: a pytest fixture)

import lerobot.checkpoints.run_writer as run_writer
from lerobot.checkpoints import from_pretrained, save_pretrained
from lerobot.checkpoints.run import load_training_state
from lerobot.checkpoints.run_layout import MODEL_FILE, checkpoint_dir, latest_checkpoint
from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import env_config
from lerobot.errors import CheckpointError, NonFiniteWeightsError, RunDirError
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training.run_dir import open_run_dir
from lerobot.training.run_dir.lock import RunLock
from lerobot.training.run_dir.saving import save_checkpoint


def setup_run(cfg) -> tuple[Path, Path | None]:
    """The run directory of `cfg` and the checkpoint a launch would resume from (`open_run_dir`, whose lock
    is released on return)."""
    with open_run_dir(cfg) as run_dir:
        return run_dir.path, run_dir.resume_from


REPO = Path(__file__).resolve().parents[1]
KEYPOINTS = [*TINY, "env=pusht_keypoints"]


def tiny_checkpoint(
    run_dir: Path, step: int, overrides: list[str] = KEYPOINTS, lock: RunLock | None = None
) -> Path:
    """Save a tiny Diffusion Policy (normalization statistics set) as checkpoint `step` of `run_dir` (by the
    holder of `lock`, when given)."""
    cfg = compose_config([*overrides, f"output_dir={run_dir}"])
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    policy = make_policy(policy_cfg, dataset_stats=stats_for(policy_cfg))
    state = {"model": policy.state_dict(), "step": step}
    return save_checkpoint(run_dir, checkpoint_files(step, policy, cfg, training_state=state), lock=lock)


def as_older_version(ckpt: Path) -> None:
    """Make `ckpt` look saved by a version without checksums: no record of them in its weights' header, no
    `checksums.json` (deleting only the file is an error: the header says there was one)."""
    path = ckpt / MODEL_FILE
    with safe_open(path, framework="pt") as f:
        metadata = {k: v for k, v in f.metadata().items() if k != "lerobot.checksums"}
    save_file(load_file(path), path, metadata=metadata)
    (ckpt / "checksums.json").unlink()


def one_line_error(capsys) -> str:
    """The one `error: ...` line on stderr (progress bars aside); fails on a traceback or several errors."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_cfg(run_dir: Path, resume: bool):
    return compose_config([*KEYPOINTS, f"output_dir={run_dir}", f"training.resume={str(resume).lower()}"])


# ------------------------------------------------------------------------ 3: stale temporaries of killed saves
def _save_and_hang(run_dir: Path, step: int, where: str, ready) -> None:
    """In a forked child: save checkpoint `step` of `run_dir` and hang, on SIGKILL's doorstep, at `where`:
    `checksums` (files written, not yet vouched for) or `rename` (a complete temporary about to replace
    the checkpoint of its step, which was renamed aside)."""
    real_replace = os.replace

    def hang(*args) -> None:
        ready.set()
        time.sleep(600)

    def replace(src, dst) -> None:
        if Path(src).name.startswith(".tmp-") and Path(dst).name.isdigit():
            hang()
        real_replace(src, dst)

    if where == "checksums":
        run_writer.write_checksums = hang
    else:
        os.replace = replace
    tiny_checkpoint(run_dir, step)


def save_and_kill(run_dir: Path, step: int, where: str) -> None:
    """Save checkpoint `step` in a real child process and SIGKILL it at `where` (see `_save_and_hang`)."""
    ctx = multiprocessing.get_context("fork")  # the child starts with everything imported: fast
    ready = ctx.Event()
    child = ctx.Process(target=_save_and_hang, args=(run_dir, step, where, ready))
    child.start()
    try:
        assert ready.wait(120), "the child never reached the point where it is killed"
    finally:
        child.kill()
        child.join()
    assert child.exitcode == -signal.SIGKILL


def test_killed_saves_leave_temporaries_that_the_next_start_removes(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    save_and_kill(run, 2, "checksums")
    ckpts = run / "checkpoints"
    legacy = ckpts / ".tmp-000000004-k2j3h4"  # named by an older version (no writer recorded)
    legacy.mkdir()
    (legacy / MODEL_FILE).write_bytes(b"x" * 1000)
    # A temporary whose writer is alive (this process) is not touched.
    alive = ckpts / f".tmp-000000005-abcd-{os.uname().nodename}@{os.getpid()}"
    alive.mkdir()
    assert len(list(ckpts.glob(".tmp-*"))) == 3

    run_dir, resume_from = setup_run(run_cfg(run, resume=True))
    assert resume_from == checkpoint_dir(run, 1)
    assert [p.name for p in ckpts.glob(".tmp-*")] == [alive.name]
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".")) == ["000000001", "last"]


def test_a_kill_between_the_renames_of_a_resave_loses_nothing(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    save_and_kill(run, 1, "rename")  # saving step 1 again: the old copy is aside, the new one complete
    assert not checkpoint_dir(run, 1).exists()
    _, resume_from = setup_run(run_cfg(run, resume=True))
    assert resume_from == checkpoint_dir(run, 1)
    assert load_training_state(resume_from)["step"] == 1
    assert not list((run / "checkpoints").glob(".tmp-*"))


# ------------------------------------------------------------------------------------- 5: dangling `last`
def test_dangling_last_resumes_from_the_newest_complete_and_refuses_a_fresh_run(tmp_path, capsys):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    tiny_checkpoint(run, 2)
    before = (checkpoint_dir(run, 1) / MODEL_FILE).read_bytes()
    for path in checkpoint_dir(run, 2).iterdir():
        path.unlink()
    checkpoint_dir(run, 2).rmdir()
    assert latest_checkpoint(run) == checkpoint_dir(run, 1)
    assert setup_run(run_cfg(run, resume=True))[1] == checkpoint_dir(run, 1)
    with pytest.raises(RunDirError, match="already holds checkpoints"):
        setup_run(run_cfg(run, resume=False))
    assert train_main([*KEYPOINTS, f"output_dir={run}", "training.resume=false"]) == 2
    assert "training.resume=auto" in one_line_error(capsys)
    assert (checkpoint_dir(run, 1) / MODEL_FILE).read_bytes() == before


# ---------------------------------------------------------------------------------- 8: flipped bytes on disk
def flip_bytes_after_header(path: Path, offset: int = 64, count: int = 8) -> None:
    """Overwrite `count` bytes of a safetensors file's tensor data (its header stays intact) with 0xFF,
    which makes float32 NaNs; `offset` counts from the start of the data."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0] + offset
    data[start : start + count] = b"\xff" * count
    path.write_bytes(bytes(data))


def test_flipped_weights_are_refused_naming_the_file_and_the_earlier_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    bad = tiny_checkpoint(run, 2)
    flip_bytes_after_header(bad / MODEL_FILE)
    assert eval_main(["--checkpoint", str(run)]) == 2
    err = one_line_error(capsys)
    assert f"{bad / MODEL_FILE} is corrupt" in err and "sha256" in err and "000000001" in err
    # Without a checksum (a checkpoint of an older version) the weights are still checked: NaN is refused.
    as_older_version(bad)
    assert eval_main(["--checkpoint", str(bad)]) == 2
    err = one_line_error(capsys)
    assert "not finite" in err and "000000001" in err


def test_a_flipped_training_state_stops_the_resume(tmp_path):
    run = tmp_path / "run"
    tiny_checkpoint(run, 1)
    path = tiny_checkpoint(run, 2) / TRAINING_STATE_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))
    _, resume_from = setup_run(run_cfg(run, resume=True))
    with pytest.raises(CheckpointError, match=f"{TRAINING_STATE_FILE} is corrupt.*move 000000002 out"):
        load_training_state(resume_from)


def test_non_finite_raw_weights_stop_the_resume(tmp_path):
    """A checkpoint of an older version (no checksums) whose training state holds NaN weights."""
    ckpt = tiny_checkpoint(tmp_path, 1)
    state = torch.load(ckpt / TRAINING_STATE_FILE, weights_only=False)
    next(iter(state["model"].values())).fill_(float("nan"))
    torch.save(state, ckpt / TRAINING_STATE_FILE)
    as_older_version(ckpt)
    with pytest.raises(
        NonFiniteWeightsError, match=f"weights in {ckpt / TRAINING_STATE_FILE} .* are not finite"
    ):
        load_training_state(ckpt)


# ------------------------------------------------------------------------------------------- 9: divergence
def test_divergence_keeps_the_last_good_checkpoint_and_gives_advice_that_fits(tmp_path, data_args, capsys):  # noqa: F811
    run = tmp_path / "run"
    # A learning rate of 1e6 blows the tiny U-Net up within two updates; every step is saved.
    args = [*KEYPOINTS, *data_args, "training.steps=6", "training.save_freq=1", "eval.freq=0"]
    assert train_main([*args, "policy.optimizer_lr=1e6", f"output_dir={run}"]) == 2
    err = one_line_error(capsys)
    assert "loss is nan at step 3" in err
    assert "000000002 holds the weights that gave it" in err and str(checkpoint_dir(run, 1)) in err
    assert "policy.optimizer_lr, now 1e+06" in err and "already clipped" in err
    assert (run / "checkpoints" / "last").resolve().name == "000000001"
    weights = load_file(checkpoint_dir(run, 1) / MODEL_FILE)
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_non_finite_weights_are_never_saved(tmp_path):
    tiny_checkpoint(tmp_path, 1)
    cfg = compose_config(KEYPOINTS)
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    policy = make_policy(policy_cfg, dataset_stats=stats_for(policy_cfg))
    with torch.no_grad():
        next(policy.parameters())[0] = float("inf")
    with pytest.raises(NonFiniteWeightsError, match="checkpoint 000000002: the weights after step 2"):
        save_checkpoint(tmp_path, checkpoint_files(2, policy, cfg))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["000000001", "last"]


# ---------------------------------------------------------------------- 11: features and architecture
@pytest.fixture(scope="module")
def image_ckpt(tmp_path_factory) -> Path:
    """An 8x8-pixel image checkpoint."""
    return tiny_checkpoint(tmp_path_factory.mktemp("img") / "run", 1, [*TINY, *TINY_IMAGE])


def test_other_image_size_is_refused_before_the_first_step(image_ckpt, capsys):
    size16 = ["env.gym_kwargs.observation_width=16", "env.gym_kwargs.observation_height=16"]
    assert (
        eval_main(
            [
                "--checkpoint",
                str(image_ckpt),
                *size16,
                "env.features={observation.image: {shape: [3, 16, 16]}}",
            ]
        )
        == 2
    )
    err = one_line_error(capsys)
    assert "'observation.image' has shape [3, 8, 8] in the checkpoint but [3, 16, 16]" in err
    # The same with config.yaml edited to say 16 px: the weights' own record still says 8.
    cfg = OmegaConf.load(image_ckpt / "config.yaml")
    cfg.env.gym_kwargs.observation_width = cfg.env.gym_kwargs.observation_height = 16
    cfg.env.features["observation.image"].shape = [3, 16, 16]
    OmegaConf.save(cfg, image_ckpt / "config.yaml")
    assert eval_main(["--checkpoint", str(image_ckpt)]) == 2
    assert "[3, 8, 8] in the checkpoint but [3, 16, 16]" in one_line_error(capsys)


def test_keypoints_checkpoint_on_pixels_is_refused(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "run", 1)
    assert eval_main(["--checkpoint", str(ckpt), "env=pusht"]) == 2
    err = one_line_error(capsys)
    assert (
        "'observation.environment_state' [16], which env 'pusht' lacks" in err
        and "env=pusht_keypoints" in err
    )


def test_changed_architecture_names_the_field_and_the_shapes(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "run", 1)
    assert eval_main(["--checkpoint", str(ckpt), "policy.down_dims=[32,64]"]) == 2
    err = one_line_error(capsys)
    assert (
        "policy.down_dims=[32, 64] but the weights were trained with [16, 32]" in err
        and "tensors differ" in err
    )
    cfg = OmegaConf.load(ckpt / "config.yaml")
    cfg.policy.down_dims = [16, 64]
    OmegaConf.save(cfg, ckpt / "config.yaml")
    assert eval_main(["--checkpoint", str(ckpt)]) == 2
    assert "policy.down_dims=[16, 64] but the weights were trained with [16, 32]" in one_line_error(capsys)


# ------------------------------------------------------------------------- 13: empty config, full disk
def test_empty_config_is_named(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "run", 1)
    (ckpt / "config.yaml").write_text("")
    assert eval_main(["--checkpoint", str(ckpt)]) == 2
    assert f"{ckpt / 'config.yaml'} is empty" in one_line_error(capsys)


def _small_file_limit() -> None:
    """In the child: a 600 kB file size limit; SIGXFSZ ignored, so that a write past it fails with EFBIG."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))


def test_full_disk_at_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, data_args):  # noqa: F811
    run = tmp_path / "run"
    args = [*KEYPOINTS, *data_args, "training.save_freq=2", "eval.freq=0", f"output_dir={run}"]
    assert train_main([*args, "training.steps=2"]) == 0
    # Resumed under a file size limit that the 1.4 MB training state does not fit (RLIMIT_FSIZE: no root).
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/train.py"), *args, "training.steps=4", "training.resume=true"],
        capture_output=True,
        text=True,
        preexec_fn=_small_file_limit,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    err = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot write checkpoint {checkpoint_dir(run, 4)}: File too large" in err[0]
    assert "needs about 1." in err[0] and "the newest checkpoint is 000000002" in err[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000002", "last"]
    assert load_training_state(latest_checkpoint(run))["step"] == 2


def test_too_little_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    """No small filesystem can be mounted without root, so the free space is what `disk_usage` reports."""
    first = tiny_checkpoint(tmp_path, 1)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    with pytest.raises(CheckpointError, match=r"000000002: no space left on device; it needs about 0\.\d MB"):
        tiny_checkpoint(tmp_path, 2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["000000001", "last"]
    assert latest_checkpoint(tmp_path) == first


# ------------------------------------------------------------------------------------------- 16: umask
@pytest.mark.parametrize("umask", [0o027, 0o002])
def test_checkpoint_modes_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        ckpt = tiny_checkpoint(tmp_path, 1)
        pretrained = save_pretrained(from_pretrained(ckpt), tmp_path / "pretrained")
    finally:
        os.umask(old)
    assert {"model.safetensors", "config.json", "config.yaml"} <= {p.name for p in ckpt.iterdir()}
    for directory in (ckpt, pretrained):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o777 & ~umask
        for path in directory.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name
