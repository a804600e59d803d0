"""Where a training run's checkpoints live, and which one a run continues from: read-only, so that loading and
evaluation find the checkpoint of a run directory without the training side, which writes them.

Layout of `run_dir/checkpoints/000001000/`:
- `model.safetensors`: the weights to evaluate (the EMA weights when the policy trains with EMA), including
  normalization statistics, which live in buffers. Its header metadata records the policy config and the
  feature shapes the weights were trained with, so that a checkpoint refuses an env or an architecture that
  does not fit it, even when `config.yaml` was edited.
- `config.yaml`: the fully resolved config of the run (env, policy, training, eval).
- `config.json`: the policy's hub-layout config (`lerobot.checkpoints.hub`), so that a checkpoint is also a
  pretrained directory (`Policy.from_pretrained`).
- `training_state.pt` (optional): raw weights, optimizer, LR scheduler, EMA, RNG states, step, extras.
- `data_fingerprint.json` (optional): what the run trained on (`lerobot.datasets.dataset_fingerprint`), so
  that a resume on other data is noticed (`lerobot.training.run_dir.resume.check_training_data`).
- `checksums.json`: the sha256 of every other file (`lerobot.runtime.checksums`), checked before each read.
`run_dir/checkpoints/last` is a symlink to the newest complete checkpoint (`latest_checkpoint` falls back to
the newest complete one when it is missing or dangling).

One checkpoint is written by `run_writer` and read by `run`; moving `last`, pruning and clearing what killed
runs left belong to the run directory, which training owns (`lerobot.training.run_dir`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from lerobot.errors import CheckpointError

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
DATA_FINGERPRINT_FILE = "data_fingerprint.json"
CHECKPOINTS_DIR = "checkpoints"
LAST_LINK = "last"
# Keys of the weights' header metadata. `lerobot.checksums` names the checksums file the checkpoint was
# saved with, so that a deleted one is an error, not a silent downgrade to unverified reading.


class Meta:
    """Keys of the weights' header metadata."""

    POLICY = "lerobot.policy"
    FEATURES = "lerobot.features"
    ENV = "lerobot.env"
    CHECKSUMS = "lerobot.checksums"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives in `run_dir`."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"{step:09d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of `run_dir` (weights and config present), oldest step first."""
    parent = Path(run_dir) / CHECKPOINTS_DIR
    if not parent.is_dir():
        return []
    found = [p for p in parent.iterdir() if p.name.isdigit() and p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(p.name))


def is_complete(path: Path) -> bool:
    """Whether the checkpoint directory `path` holds its weights and its config."""
    return (path / MODEL_FILE).is_file() and (path / CONFIG_FILE).is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to continue `run_dir` from: the one `last` points at, or, when that link is missing
    or dangling, the newest complete checkpoint; None when the run has none."""
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    if link.exists() and is_complete(link.resolve()):
        return link.resolve()
    found = list_checkpoints(run_dir)
    if found and link.is_symlink():
        log.warning(
            "%s points at %s, which is missing or incomplete; using the newest complete checkpoint %s",
            link,
            os.readlink(link),
            found[-1].name,
        )
    return found[-1] if found else None


def resolve_checkpoint_dir(path: Path | str) -> Path:
    """Accept a checkpoint directory, a `checkpoints/` folder or a run directory; return the checkpoint."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if (path / MODEL_FILE).exists() or (path / CONFIG_FILE).exists():
        return path
    run_dir = path.parent if path.name == CHECKPOINTS_DIR else path
    found = latest_checkpoint(run_dir)
    if found is None:
        raise CheckpointError(
            f"{path} is not a checkpoint: it holds no {MODEL_FILE} and no complete checkpoint"
        )
    return found


def other_checkpoints_hint(ckpt_dir: Path) -> str:
    """What to use instead of the bad checkpoint `ckpt_dir`: the other complete ones of its run, if any."""
    ckpt_dir = Path(ckpt_dir)
    others = [p.name for p in list_checkpoints(ckpt_dir.parent.parent) if p.name != ckpt_dir.name]
    if ckpt_dir.parent.name != CHECKPOINTS_DIR or not others:
        return "no other checkpoint of this run exists: train again"
    return (
        f"use an earlier checkpoint of this run ({', '.join(others)} in {ckpt_dir.parent}): evaluate one with "
        f"--checkpoint {ckpt_dir.parent}/<step>; to resume from {others[-1]}, move {ckpt_dir.name} out of "
        "checkpoints/"
    )
