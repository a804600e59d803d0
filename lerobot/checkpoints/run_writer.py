"""Writing one checkpoint of a run (the layout: `run_layout`): its files serialized first (`checkpoint_files`,
which refuses weights that are not finite), then written whole or not at all (`write_checkpoint`).

A checkpoint is written into a temporary sibling (`.tmp-<step>-<random>-locked-<host>@<pid>`) that its writer
holds a `flock` on, and renamed when complete; a checkpoint of the same step is renamed aside to such a
temporary first (`move_aside`), and a file or link found where the checkpoint directory belongs is renamed
aside, never deleted (`set_aside`). Before anything is written, the free space is compared with an upper
bound of what the checkpoint takes (`lerobot.checkpoints.space`). `model.safetensors` has the same bytes for
the same weights and config in any process.

Moving `last` to the new checkpoint, and telling which temporaries killed writers left (`TEMPORARY_PREFIX`,
`LOCKED`), belong to the run directory (`lerobot.training.run_dir`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lerobot.checkpoints.hub import (
    CONFIG_JSON,
    hub_config_text,
    policy_fields,
    serialize_weights,
    write_weights,
)
from lerobot.checkpoints.run import raise_if_non_finite
from lerobot.checkpoints.run_layout import (
    CONFIG_FILE,
    DATA_FINGERPRINT_FILE,
    MODEL_FILE,
    Meta,
    checkpoint_dir,
    latest_checkpoint,
)
from lerobot.checkpoints.space import checkpoint_bytes
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE
from lerobot.config import PolicyConfig, env_config
from lerobot.errors import CheckpointError
from lerobot.runtime.checksums import CHECKSUMS_FILE, write_checksums
from lerobot.runtime.files import no_space_error, open_dir, try_flock

log = logging.getLogger(__name__)

TEMPORARY_PREFIX = ".tmp-"
# The word after the step and the random token in the name of a temporary whose writer holds a `flock` on
# it (`_make_temporary`); the temporaries of older versions name the writer's host and pid there.
LOCKED = "locked"
# What a file or link found where a checkpoint directory belongs is renamed to (`<name><suffix>`, then
# `-1`, `-2`, ...): kept for its owner, under a name no checkpoint has.
_STRAY_SUFFIX = ".not-a-checkpoint"


@dataclass
class CheckpointFiles:
    """The content of a checkpoint's files, serialized (`checkpoint_files`) and not yet written."""

    step: int
    weights: list[bytes | memoryview]  # `model.safetensors`, as `serialize_weights` pieces
    texts: dict[str, str]  # file name -> text: the configs, and the data fingerprint when there is one
    training_state: dict[str, Any] | None


def checkpoint_files(
    step: int,
    policy: nn.Module,
    cfg: DictConfig,
    training_state: dict[str, Any] | None = None,
    eval_state_dict: dict[str, torch.Tensor] | None = None,
    data_fingerprint: dict[str, Any] | None = None,
) -> CheckpointFiles:
    """The files of checkpoint `step`, serialized.

    `eval_state_dict` replaces the policy's own weights in `model.safetensors` (e.g. EMA weights).
    `data_fingerprint` (the training data's, when the run reads a dataset) goes to `data_fingerprint.json`.
    Raises `NonFiniteWeightsError` when the weights to save, or the policy's own, are not finite.
    """
    state = eval_state_dict if eval_state_dict is not None else policy.state_dict()
    for named in (state, policy.state_dict()):
        raise_if_non_finite(named, f"not saving checkpoint {step:09d}: the weights after step {step}")
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    weights = serialize_weights(tensors, _weights_metadata(cfg, policy.config))
    # config.json next to model.safetensors makes the checkpoint a hub-layout pretrained directory too.
    texts = {
        CONFIG_FILE: OmegaConf.to_yaml(cfg, resolve=True),
        CONFIG_JSON: hub_config_text(policy.config, env_config(cfg)),
    }
    if data_fingerprint is not None:
        texts[DATA_FINGERPRINT_FILE] = json.dumps(data_fingerprint, indent=1)
    return CheckpointFiles(step, weights, texts, training_state)


def write_checkpoint(run_dir: Path, files: CheckpointFiles) -> Path:
    """Write `files` as the checkpoint of their step in `run_dir`, atomically; return its directory.

    Raises `CheckpointError` naming the path and the space needed when the disk is full; then the temporary
    directory is removed and the previous checkpoints stay as they were.
    """
    final = checkpoint_dir(run_dir, files.step)
    final.parent.mkdir(parents=True, exist_ok=True)
    texts = files.texts
    sizes = [
        sum(memoryview(piece).nbytes for piece in files.weights),
        *(len(t.encode()) for t in texts.values()),
    ]
    needed = checkpoint_bytes(final.parent, sizes, files.training_state)
    free = shutil.disk_usage(final.parent).free
    if free < needed:  # refuse before filling the disk up: other writers (logs, evaluations) need it too
        raise CheckpointError(_no_space_message(run_dir, final, "no space left on device", needed, free))
    tmp, tmp_lock = _make_temporary(final.parent, files.step)
    try:
        write_weights(tmp / MODEL_FILE, files.weights)
        for name in (CONFIG_FILE, CONFIG_JSON):
            (tmp / name).write_text(texts[name], encoding="utf-8")
        if files.training_state is not None:
            with open(tmp / TRAINING_STATE_FILE, "wb") as f:
                torch.save(files.training_state, f)
        if DATA_FINGERPRINT_FILE in texts:
            (tmp / DATA_FINGERPRINT_FILE).write_text(texts[DATA_FINGERPRINT_FILE], encoding="utf-8")
        write_checksums(tmp)
        _replace_dir(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = no_space_error(e)
        if full is None:
            raise
        reason = f"{full.strerror} ({full.filename or tmp})"
        free = shutil.disk_usage(final.parent).free
        raise CheckpointError(_no_space_message(run_dir, final, reason, needed, free)) from None
    finally:
        os.close(tmp_lock)
    return final


def _temporary_name(parent: Path, step: int) -> Path:
    """A fresh temporary name for `step` in `parent`; the host and pid in it are for people to read."""
    writer = f"{LOCKED}-{socket.gethostname()}@{os.getpid()}"
    while True:
        path = parent / f"{TEMPORARY_PREFIX}{step:09d}-{secrets.token_hex(4)}-{writer}"
        if not os.path.lexists(path):
            return path


def _make_temporary(parent: Path, step: int) -> tuple[Path, int]:
    """A new, empty temporary directory for `step` in `parent`, and a descriptor holding a `flock` on it.

    The lock tells the cleaner of stale temporaries (`lerobot.training.run_dir.cleanup`) that the directory
    is being written, in any process, PID namespace or container; the kernel drops it when the writer exits,
    however it exits. Closing the descriptor (after the rename into place, or the removal) drops it.
    `os.mkdir` (not `tempfile.mkdtemp`, which makes it 0700) so that its mode follows the user's umask.
    """
    while True:
        path = _temporary_name(parent, step)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        fd = open_dir(path)
        if try_flock(fd) is not False:  # None: the file system cannot lock it (the pid check then applies)
            return path, fd
        os.close(fd)  # a cleaner took it the moment it was made: leave it to that one


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is first renamed aside (to a temporary name, locked
    like a temporary, so that a kill in between leaves nothing that the cleaner of stale temporaries cannot
    sort out) and then removed. A file or link that is not a directory at `final` is kept under another
    name (`set_aside`): the checkpoint is written, and nothing of the user's is deleted."""
    aside, aside_lock = None, None
    if is_stray(final):
        moved = set_aside(final)
        log.warning(
            "%s was not a checkpoint directory: moved it to %s and saved the checkpoint", final, moved
        )
    elif final.exists():
        aside, aside_lock = move_aside(final)
    try:
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        if aside_lock is not None:
            os.close(aside_lock)


def move_aside(ckpt: Path) -> tuple[Path, int]:
    """Rename the checkpoint directory `ckpt` to a temporary name beside it, holding a `flock` on it (like a
    temporary being written); return the new name and the lock's descriptor, which the caller closes."""
    lock = open_dir(ckpt)
    try_flock(lock)
    aside = _temporary_name(ckpt.parent, int(ckpt.name))
    os.replace(ckpt, aside)
    return aside, lock


def is_stray(path: Path) -> bool:
    """Whether something that is not a directory (a file, a link to one, a dangling link) is at `path`."""
    return os.path.lexists(path) and not path.is_dir()


def set_aside(path: Path) -> Path:
    """Rename `path` (see `is_stray`) to a free `<name>.not-a-checkpoint[-N]` beside it; return that name."""
    n = 0
    while True:
        aside = path.with_name(f"{path.name}{_STRAY_SUFFIX}{f'-{n}' if n else ''}")
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
        n += 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _weights_metadata(cfg: DictConfig, policy_cfg: PolicyConfig) -> dict[str, str]:
    """What the weights were trained with: the policy config, the env's name and its feature shapes; and
    that the checkpoint has checksums. Keys sorted, so that the same content gives the same bytes."""
    features = {k: list(v.shape) for k, v in env_config(cfg).features.items()}
    return {
        Meta.POLICY: json.dumps(policy_fields(policy_cfg), sort_keys=True),
        Meta.FEATURES: json.dumps(features, sort_keys=True),
        Meta.ENV: str(cfg.env.name),
        Meta.CHECKSUMS: CHECKSUMS_FILE,
    }


def _no_space_message(run_dir: Path, final: Path, reason: str, needed: int, free: int) -> str:
    return (
        f"cannot write checkpoint {final}: {reason}; it needs about {megabytes(needed)} and "
        f"{megabytes(free)} are free there; nothing was changed ({_last_note(run_dir)}): free space (or raise "
        "the file size limit) and resume with training.resume=true"
    )


def _last_note(run_dir: Path) -> str:
    last = latest_checkpoint(run_dir)
    return f"the newest checkpoint is {last.name}" if last is not None else "no checkpoint was saved yet"


def megabytes(n: int) -> str:
    """`n` bytes in words: `1.4 MB`."""
    return f"{n / 1e6:.1f} MB"
