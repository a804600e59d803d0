"""Checkpoints: a directory per step, written atomically, verified when read, loadable without any dataset.

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
  that a resume on other data is noticed (`lerobot.training.run_dir.check_training_data`).
- `checksums.json`: the sha256 of every other file (`lerobot.runtime.checksums`), checked before each read.
`run_dir/checkpoints/last` is a symlink to the newest complete checkpoint; it never moves back to an
earlier step (a save behind it means a second writer). A checkpoint is written into a temporary sibling
(`.tmp-<step>-<random>-locked-<host>@<pid>`) that its writer holds a `flock` on, and renamed when complete;
temporaries left by a killed run (their lock is free, whatever pid their name holds) are removed (or, when
complete, put in place) by `remove_stale_temporaries` when a run starts; a file or link found where a
checkpoint directory belongs is renamed aside, never deleted (`set_aside_strays`, and the save of that step).
Weights that are not finite are never saved, and `model.safetensors` has the same bytes for the same weights
and config in any process. `prune_checkpoints` deletes the older checkpoints a run no longer keeps
(`training.keep_checkpoints`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import safe_open
from torch import nn

from lerobot.checkpoints.hub import (
    CONFIG_JSON,
    hub_config_text,
    policy_fields,
    serialize_weights,
    write_weights,
)
from lerobot.checkpoints.space import checkpoint_bytes
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE, safe_load_state
from lerobot.config import (
    PolicyConfig,
    config_differences,
    env_config,
    policy_config,
    policy_section,
    upgrade_saved_config,
)
from lerobot.errors import CheckpointError, ChecksumError, NonFiniteWeightsError, RunDirError
from lerobot.policy_registry import (
    available_policies,
    make_policy,
    policy_config_class,
    validate_run_config,
)
from lerobot.runtime.checksums import (
    CHECKSUMS_FILE,
    file_sha256,
    read_checksums,
    verify_checksum,
    write_checksums,
)
from lerobot.runtime.files import no_space_error, open_dir, try_flock, verify_run_dir

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
DATA_FINGERPRINT_FILE = "data_fingerprint.json"
CHECKPOINTS_DIR = "checkpoints"
LAST_LINK = "last"
_TMP_PREFIX = ".tmp-"
# The word after the step and the random token in the name of a temporary whose writer holds a `flock` on
# it (`_make_temporary`); the temporaries of older versions name the writer's host and pid there.
_LOCKED = "locked"
_LAST_TMP = f".{LAST_LINK}.tmp"
# Keys of the weights' header metadata. `lerobot.checksums` names the checksums file the checkpoint was
# saved with, so that a deleted one is an error, not a silent downgrade to unverified reading.
_META_POLICY = "lerobot.policy"
_META_FEATURES = "lerobot.features"
_META_ENV = "lerobot.env"
_META_CHECKSUMS = "lerobot.checksums"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives in `run_dir`."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"{step:09d}"


# ------------------------------------------------------------------------------------------------ saving
def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: nn.Module,
    cfg: DictConfig,
    training_state: dict[str, Any] | None = None,
    eval_state_dict: dict[str, torch.Tensor] | None = None,
    data_fingerprint: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint for `step` atomically and point `last` at it; return its directory.

    `eval_state_dict` replaces the policy's own weights in `model.safetensors` (e.g. EMA weights).
    `data_fingerprint` (the training data's, when the run reads a dataset) goes to `data_fingerprint.json`.
    Raises `NonFiniteWeightsError` (writing nothing) when the weights to save, or the policy's own, are not
    finite, `CheckpointError` naming the path and the space needed when the disk is full, and `RunDirError`
    when this process no longer owns `run_dir` (`lerobot.runtime.files.verify_run_dir`) or `last` points at
    a later step (another writer); in every failure the temporary directory is removed and the previous
    checkpoints stay as they were.
    """
    state = eval_state_dict if eval_state_dict is not None else policy.state_dict()
    for named in (state, policy.state_dict()):
        _raise_if_non_finite(named, f"not saving checkpoint {step:09d}: the weights after step {step}")
    verify_run_dir(run_dir)  # before anything is made in it
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    newer = _newer_last(run_dir, step)
    if newer is not None:
        raise RunDirError(f"not saving checkpoint {step:09d}: {_second_writer(run_dir, newer)}")
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    weights = serialize_weights(tensors, _weights_metadata(cfg, policy.config))
    # config.json next to model.safetensors makes the checkpoint a hub-layout pretrained directory too.
    texts = {
        CONFIG_FILE: OmegaConf.to_yaml(cfg, resolve=True),
        CONFIG_JSON: hub_config_text(policy.config, env_config(cfg)),
    }
    if data_fingerprint is not None:
        texts[DATA_FINGERPRINT_FILE] = json.dumps(data_fingerprint, indent=1)
    sizes = [sum(memoryview(piece).nbytes for piece in weights), *(len(t.encode()) for t in texts.values())]
    needed = checkpoint_bytes(final.parent, sizes, training_state)
    free = shutil.disk_usage(final.parent).free
    if free < needed:  # refuse before filling the disk up: other writers (logs, evaluations) need it too
        raise CheckpointError(_no_space_message(run_dir, final, "no space left on device", needed, free))
    tmp, tmp_lock = _make_temporary(final.parent, step)
    try:
        write_weights(tmp / MODEL_FILE, weights)
        for name in (CONFIG_FILE, CONFIG_JSON):
            (tmp / name).write_text(texts[name], encoding="utf-8")
        if training_state is not None:
            with open(tmp / TRAINING_STATE_FILE, "wb") as f:
                torch.save(training_state, f)
        if data_fingerprint is not None:
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
    newer = _newer_last(run_dir, step)  # again: the write took a while
    if newer is not None:
        raise RunDirError(
            f"checkpoint {step:09d} was written but `last` stays: {_second_writer(run_dir, newer)}"
        )
    set_last(run_dir, final)
    return final


def _newer_last(run_dir: Path, step: int) -> str | None:
    """The checkpoint `last` points at when it is complete and of a later step than `step`, else None."""
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    if not link.is_symlink():
        return None
    target = link.resolve()
    if target.parent != link.parent.resolve() or not target.name.isdigit() or not _is_complete(target):
        return None  # dangling (resumed from the newest complete checkpoint), or pointed elsewhere by hand
    return target.name if int(target.name) > step else None


def _second_writer(run_dir: Path, newer: str) -> str:
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    return (
        f"{link} points at {newer}, a later step, which another run writing {run_dir} saved; a run "
        "directory takes one writer at a time: stop the other run, or train into another output_dir"
    )


def set_last(run_dir: Path, ckpt_dir: Path) -> None:
    """Point `run_dir/checkpoints/last` at `ckpt_dir` (atomically: a new link renamed over the old one)."""
    parent = Path(run_dir) / CHECKPOINTS_DIR
    tmp_link = parent / _LAST_TMP
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(Path(ckpt_dir).name)
    os.replace(tmp_link, parent / LAST_LINK)


def _temporary_name(parent: Path, step: int) -> Path:
    """A fresh temporary name for `step` in `parent`; the host and pid in it are for people to read."""
    writer = f"{_LOCKED}-{socket.gethostname()}@{os.getpid()}"
    while True:
        path = parent / f"{_TMP_PREFIX}{step:09d}-{secrets.token_hex(4)}-{writer}"
        if not os.path.lexists(path):
            return path


def _make_temporary(parent: Path, step: int) -> tuple[Path, int]:
    """A new, empty temporary directory for `step` in `parent`, and a descriptor holding a `flock` on it.

    The lock tells `remove_stale_temporaries` that the directory is being written, in any process, PID
    namespace or container; the kernel drops it when the writer exits, however it exits. Closing the
    descriptor (after the rename into place, or the removal) drops it. `os.mkdir` (not
    `tempfile.mkdtemp`, which makes it 0700) so that its mode follows the user's umask.
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
    like a temporary, so that a kill in between leaves nothing that `remove_stale_temporaries` cannot sort
    out) and then removed. A file or link that is not a directory at `final` is kept under another name
    (`_set_aside`): the checkpoint is written, and nothing of the user's is deleted."""
    aside, aside_lock = None, None
    if _is_stray(final):
        moved = _set_aside(final)
        log.warning(
            "%s was not a checkpoint directory: moved it to %s and saved the checkpoint", final, moved
        )
    elif final.exists():
        aside, aside_lock = _move_aside(final)
    try:
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        if aside_lock is not None:
            os.close(aside_lock)


def _move_aside(ckpt: Path) -> tuple[Path, int]:
    """Rename the checkpoint directory `ckpt` to a temporary name beside it, holding a `flock` on it (like a
    temporary being written); return the new name and the lock's descriptor, which the caller closes."""
    lock = open_dir(ckpt)
    try_flock(lock)
    aside = _temporary_name(ckpt.parent, int(ckpt.name))
    os.replace(ckpt, aside)
    return aside, lock


# What a file or link found where a checkpoint directory belongs is renamed to (`<name><suffix>`, then
# `-1`, `-2`, ...): kept for its owner, under a name no checkpoint has.
_STRAY_SUFFIX = ".not-a-checkpoint"


def _is_stray(path: Path) -> bool:
    """Whether something that is not a directory (a file, a link to one, a dangling link) is at `path`."""
    return os.path.lexists(path) and not path.is_dir()


def _set_aside(path: Path) -> Path:
    """Rename `path` (see `_is_stray`) to a free `<name>.not-a-checkpoint[-N]` beside it; return that name."""
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
        _META_POLICY: json.dumps(policy_fields(policy_cfg), sort_keys=True),
        _META_FEATURES: json.dumps(features, sort_keys=True),
        _META_ENV: str(cfg.env.name),
        _META_CHECKSUMS: CHECKSUMS_FILE,
    }


def _no_space_message(run_dir: Path, final: Path, reason: str, needed: int, free: int) -> str:
    return (
        f"cannot write checkpoint {final}: {reason}; it needs about {_mb(needed)} and {_mb(free)} are free "
        f"there; nothing was changed ({_last_note(run_dir)}): free space (or raise the file size limit) and "
        "resume with training.resume=true"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# ------------------------------------------------------------------------------- finding and cleaning
def list_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of `run_dir` (weights and config present), oldest step first."""
    parent = Path(run_dir) / CHECKPOINTS_DIR
    if not parent.is_dir():
        return []
    found = [p for p in parent.iterdir() if p.name.isdigit() and p.is_dir() and _is_complete(p)]
    return sorted(found, key=lambda p: int(p.name))


def _is_complete(path: Path) -> bool:
    return (path / MODEL_FILE).is_file() and (path / CONFIG_FILE).is_file()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to continue `run_dir` from: the one `last` points at, or, when that link is missing
    or dangling, the newest complete checkpoint; None when the run has none."""
    link = Path(run_dir) / CHECKPOINTS_DIR / LAST_LINK
    if link.exists() and _is_complete(link.resolve()):
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


def remove_stale_temporaries(run_dir: Path) -> None:
    """Remove the temporary checkpoint directories that killed runs left in `run_dir/checkpoints/`.

    A temporary is stale when its `flock` can be taken: its writer, which held it while writing, has exited
    (the kernel dropped the lock), whatever pid its name holds, in whatever PID namespace it ran. The lock
    is kept while the temporary is removed or put in place. Temporaries of older versions, which took no
    lock, are stale when the process named in them is no longer alive on this host, when they were made on
    another host (a run directory has one writer at a time) or when they name no writer.
    A stale temporary that is complete and verifies against its checksums, while its step has no
    checkpoint (a kill between renaming the old copy aside and the new one in place), becomes that
    checkpoint; every other one is deleted.
    """
    parent = Path(run_dir) / CHECKPOINTS_DIR
    if not parent.is_dir():
        return
    if (parent / _LAST_TMP).is_symlink():
        (parent / _LAST_TMP).unlink()
    stale, locks = [], []
    try:
        for path in parent.glob(f"{_TMP_PREFIX}*"):
            gone, lock = _claim_if_stale(path)
            if lock is not None:
                locks.append(lock)
            if gone:
                stale.append(path)
        _remove_or_recover(parent, stale)
    finally:
        for lock in locks:
            os.close(lock)


def _remove_or_recover(parent: Path, stale: list[Path]) -> None:
    """Put the complete, verified stale temporaries of steps without a checkpoint in place; delete the rest."""
    freed, removed = 0, 0
    for tmp in sorted(stale, key=lambda p: p.lstat().st_mtime, reverse=True):  # newest copy of a step first
        step = tmp.name[len(_TMP_PREFIX) :].split("-")[0]
        final = parent / step
        if step.isdigit() and not final.exists() and _verifies(tmp):
            os.replace(tmp, final)
            log.warning("recovered checkpoint %s from the complete temporary %s", final, tmp.name)
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            freed += sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file() and not p.is_symlink())
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info(
            "removed %d stale temporary checkpoint directories from %s (%s)", removed, parent, _mb(freed)
        )


def _claim_if_stale(path: Path) -> tuple[bool, int | None]:
    """Whether the temporary `path` is stale, and a descriptor holding its lock when it was taken (so that
    no other cleaner takes it meanwhile); the caller closes it."""
    parts = path.name[len(_TMP_PREFIX) :].split("-", 3)
    if len(parts) < 4 or parts[2] != _LOCKED:
        return _old_writer_is_gone(path.name), None
    if path.is_symlink() or not path.is_dir():
        return True, None
    try:
        fd = open_dir(path)
    except FileNotFoundError:  # gone meanwhile
        return False, None
    taken = try_flock(fd)
    if taken:
        return True, fd
    os.close(fd)
    if taken is None:  # a file system that cannot lock directories: the writer's name is all there is
        return _old_writer_is_gone(path.name), None
    return False, None


def _old_writer_is_gone(name: str) -> bool:
    """Whether the writer named in a temporary's name (`...-<host>@<pid>`) is gone: this check is for the
    temporaries of older versions (they took no lock); a pid says nothing across PID namespaces."""
    pid = name.rpartition("@")[2]
    if not pid.isdigit():
        return True
    if not name.endswith(f"-{socket.gethostname()}@{pid}"):
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


def _verifies(directory: Path) -> bool:
    try:
        sums = read_checksums(directory)
    except ChecksumError:
        return False
    if not sums or not {MODEL_FILE, CONFIG_FILE} <= set(sums):
        return False
    return all((directory / n).is_file() and file_sha256(directory / n) == h for n, h in sums.items())


def set_aside_strays(run_dir: Path) -> list[Path]:
    """Rename aside (`_set_aside`) every entry of `run_dir/checkpoints/` named like a checkpoint (a step)
    that is not a directory: a file or a link put where a checkpoint was. Each is a warning; the run then
    resumes from the newest real checkpoint, and saving that step again finds its name free. Returns the
    new names."""
    parent = Path(run_dir) / CHECKPOINTS_DIR
    if not parent.is_dir():
        return []
    moved = []
    for path in sorted(p for p in parent.iterdir() if p.name.isdigit() and _is_stray(p)):
        moved.append(_set_aside(path))
        log.warning(
            "%s is not a checkpoint directory (a file or a link was put in its place): renamed it to %s and "
            "left it there; the run goes on from the newest checkpoint that is whole",
            path,
            moved[-1].name,
        )
    return moved


def prune_checkpoints(run_dir: Path, keep: int, also_keep: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """Delete the checkpoints of `run_dir` older than its newest `keep` (counted up to the one `last` points
    at); never the one `last` points at, nor those of `also_keep`. Checkpoints of later steps than `last`'s
    (a diverged run's, kept for inspection) are neither counted nor deleted. Returns the deleted steps.

    Each is renamed aside to a locked temporary first, so that it leaves the listing at once, and its
    checksums go first, so that a kill during the deletion leaves a temporary that the next start removes
    rather than puts back.
    """
    last = latest_checkpoint(run_dir)
    if last is None:
        return []
    kept = {last.name, *(Path(p).name for p in also_keep)}
    found = [p for p in list_checkpoints(run_dir) if int(p.name) <= int(last.name)]
    doomed = [p for p in found[: max(len(found) - keep, 0)] if p.name not in kept]
    for ckpt in doomed:
        aside, lock = _move_aside(ckpt)
        try:
            (aside / CHECKSUMS_FILE).unlink(missing_ok=True)
            shutil.rmtree(aside, ignore_errors=True)
        finally:
            os.close(lock)
    return [p.name for p in doomed]


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


# ----------------------------------------------------------------------------------------------- loading
def _require_checksums(ckpt_dir: Path) -> None:
    """Raise `CheckpointError` when `checksums.json` is missing from a checkpoint whose weights record that
    it was saved with one; a checkpoint of an older version (no such record) is read unverified, with a
    warning."""
    ckpt_dir = Path(ckpt_dir)
    if (ckpt_dir / CHECKSUMS_FILE).exists() or not _records_checksums(ckpt_dir):
        return
    raise CheckpointError(
        f"checkpoint {ckpt_dir} was saved with checksums but {ckpt_dir / CHECKSUMS_FILE} is missing, so its "
        "files cannot be verified: restore that file (copy the checkpoint directory again, whole), or, if "
        'you trust the files as they are, record new checksums with `python -c "from '
        f"lerobot.runtime.checksums import write_checksums; write_checksums('{ckpt_dir}')\"`; "
        f"{other_checkpoints_hint(ckpt_dir)}"
    )


def _records_checksums(ckpt_dir: Path) -> bool:
    """Whether the weights' header says the checkpoint was saved with `checksums.json`."""
    path = Path(ckpt_dir) / MODEL_FILE
    if not path.is_file():
        return False
    try:
        with safe_open(path, framework="pt") as f:
            return _META_CHECKSUMS in (f.metadata() or {})
    except Exception:  # a corrupt header: reading the weights reports it
        return False


def _verified(ckpt_dir: Path, name: str) -> Path:
    """`ckpt_dir/name`, after checking it against the checkpoint's checksums (a `CheckpointError` if not)."""
    path = Path(ckpt_dir) / name
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {ckpt_dir} is incomplete: {name} is missing; {other_checkpoints_hint(ckpt_dir)}"
        )
    _require_checksums(ckpt_dir)
    try:
        verify_checksum(ckpt_dir, name)
    except ChecksumError as e:
        raise CheckpointError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return path


def load_config(ckpt_dir: Path) -> DictConfig:
    """The validated run config stored in a checkpoint.

    A `config.yaml` that differs from its saved checksum but is still a valid config was edited on purpose:
    that is only a warning (the weights' own record then catches a changed architecture or feature).
    """
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / CONFIG_FILE
    if not path.exists():
        raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: {CONFIG_FILE} is missing")
    _require_checksums(ckpt_dir)
    try:
        verify_checksum(ckpt_dir, CONFIG_FILE)
        changed = None
    except ChecksumError as e:
        changed = str(e)
    try:
        cfg = OmegaConf.load(path)
        if not isinstance(cfg, DictConfig) or "env" not in cfg or "policy" not in cfg:
            kind = "empty" if not path.read_text().strip() else "corrupt (no env and policy sections)"
            raise CheckpointError(f"{path} is {kind}: the checkpoint's config is lost")
        # Keys an older version saved, in today's places: the inference settings (once under `policy`), then
        # the policy's own.
        upgrade_saved_config(cfg)
        name = OmegaConf.select(cfg, "policy.name")
        if name in available_policies():
            policy_config_class(name).upgrade_saved(cfg.policy)
        cfg = validate_run_config(cfg)
    except Exception as e:
        reason = str(e) if isinstance(e, CheckpointError) else f"{path} is not a valid config: {e}"
        if changed is not None and not isinstance(e, CheckpointError):
            reason = f"{reason} ({changed})"
        raise CheckpointError(f"{reason}; {other_checkpoints_hint(ckpt_dir)}") from None
    if changed is not None:
        log.warning("%s was modified after it was saved (%s)", path, changed)
    return cfg


def read_weights(ckpt_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The verified, finite weights of a checkpoint and their header metadata (empty for older checkpoints)."""
    path = _verified(ckpt_dir, MODEL_FILE)
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    except Exception as e:  # safetensors raises several types for corrupt files
        raise CheckpointError(
            f"{path} is corrupt or truncated ({e}); {other_checkpoints_hint(ckpt_dir)}"
        ) from None
    try:
        _raise_if_non_finite(state, f"the weights in {path} (saved by a run that had diverged)")
    except NonFiniteWeightsError as e:
        raise NonFiniteWeightsError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return state, metadata


def weights_metadata(ckpt_dir: Path) -> dict[str, str]:
    """The header metadata of a checkpoint's weights (without reading the tensors); {} when it has none."""
    path = Path(ckpt_dir) / MODEL_FILE
    try:
        with safe_open(path, framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:
        raise CheckpointError(
            f"{path} is corrupt or truncated ({e}); {other_checkpoints_hint(ckpt_dir)}"
        ) from None


def check_features(ckpt_dir: Path, cfg: DictConfig) -> None:
    """Raise `CheckpointError` naming the first feature whose shape differs between what the checkpoint's
    weights were trained with and what the env of `cfg` provides (or that only one side has)."""
    ckpt_dir = Path(ckpt_dir)
    meta = weights_metadata(ckpt_dir) if (ckpt_dir / MODEL_FILE).exists() else {}
    if _META_FEATURES in meta:
        want, trained_env = json.loads(meta[_META_FEATURES]), meta.get(_META_ENV, "?")
    else:  # saved before the weights recorded their features: the config is the record
        trained = load_config(ckpt_dir)
        want = {k: list(v.shape) for k, v in env_config(trained).features.items()}
        trained_env = trained.env.name
    env = env_config(cfg)
    have = {k: list(v.shape) for k, v in env.features.items()}
    problems = []
    for key in sorted(want.keys() | have.keys()):
        if key not in have:
            problems.append(f"the checkpoint needs feature {key!r} {want[key]}, which env {env.name!r} lacks")
        elif key not in want:
            problems.append(f"env {env.name!r} gives feature {key!r} {have[key]}, which the checkpoint lacks")
        elif want[key] != have[key]:
            problems.append(
                f"feature {key!r} has shape {want[key]} in the checkpoint but {have[key]} in env {env.name!r}"
            )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"{problems[0]}{more}; evaluate it on the env it was trained on (env={trained_env}, with the "
            "observation size it was trained with)"
        )


def load_run_policy(
    ckpt_dir: Path | str, device: str | torch.device = "cpu", cfg: DictConfig | None = None
) -> tuple[nn.Module, DictConfig]:
    """Rebuild the policy of a checkpoint from its config and weights; return `(policy, cfg)`.

    `cfg` (optional) replaces the stored config, e.g. with evaluation overrides applied. The weights are
    verified against their checksum and must be finite; a policy config whose architecture differs from
    the one the weights were trained with is refused, naming the differing fields and shapes.
    """
    ckpt_dir = resolve_checkpoint_dir(ckpt_dir)
    cfg = load_config(ckpt_dir) if cfg is None else cfg
    policy_cfg = policy_config(cfg)
    policy = make_policy(policy_cfg)
    state, metadata = read_weights(ckpt_dir)
    weights = ckpt_dir / MODEL_FILE
    own = policy.state_dict()
    differ = [
        (k, tuple(state[k].shape), tuple(v.shape))
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if differ:
        saved = json.loads(metadata[_META_POLICY]) if _META_POLICY in metadata else None
        if saved is None:  # older checkpoint: compare with its config.yaml (catches command-line overrides)
            saved = policy_section(load_config(ckpt_dir))
        fields = config_differences(saved, policy_section(cfg), prefix="policy.")
        named = "; ".join(f"{k}={b} but the weights were trained with {a}" for k, a, b in fields[:3])
        key, a, b = differ[0]
        raise CheckpointError(
            f"{weights} does not fit the configured policy ({named or 'its architecture differs'}): "
            f"{len(differ)} tensors differ in shape, e.g. {key} is {list(a)} in the checkpoint and {list(b)} "
            "in the model; drop the override (or restore config.yaml)"
        )
    missing, unexpected = policy.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match policy {policy_cfg.name!r}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return policy.to(device), cfg


def read_data_fingerprint(ckpt_dir: Path) -> dict[str, Any] | None:
    """The fingerprint of the data the checkpoint was trained on, verified; None when it records none (a
    checkpoint of a run without a dataset, or saved before checkpoints recorded one)."""
    if not (Path(ckpt_dir) / DATA_FINGERPRINT_FILE).exists():
        return None
    path = _verified(ckpt_dir, DATA_FINGERPRINT_FILE)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is corrupt ({e}); {other_checkpoints_hint(ckpt_dir)}") from None


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    """The optimizer/scheduler/EMA/RNG/step state saved next to the weights, verified and checked finite.

    It is read with `torch.load(weights_only=True)`: tensors and plain containers only, so a crafted file
    cannot run code (`safe_load_state`).
    """
    path = Path(ckpt_dir) / TRAINING_STATE_FILE
    if not path.exists():
        raise CheckpointError(f"cannot resume from {ckpt_dir}: {TRAINING_STATE_FILE} is missing")
    _verified(ckpt_dir, TRAINING_STATE_FILE)
    state = safe_load_state(path, other_checkpoints_hint(ckpt_dir))
    weights = dict(state.get("model") or {})
    ema = state.get("ema") or {}
    weights.update({f"ema.shadow_params.{i}": t for i, t in enumerate(ema.get("shadow_params", []))})
    try:
        _raise_if_non_finite(weights, f"the weights in {path} (saved by a run that had diverged)")
    except NonFiniteWeightsError as e:
        raise NonFiniteWeightsError(f"{e}; {other_checkpoints_hint(ckpt_dir)}") from None
    return state


def raw_weights(ckpt_dir: Path | str) -> dict[str, torch.Tensor]:
    """The optimizer's own weights of a checkpoint trained with EMA (`policy.use_ema=true`), whose
    `model.safetensors` holds the averaged ones: to evaluate what EMA changes on the same run.

    Raises `CheckpointError` when the checkpoint keeps no training state or was trained without EMA (its
    `model.safetensors` is then the raw weights already).
    """
    ckpt_dir = resolve_checkpoint_dir(ckpt_dir)
    if not (ckpt_dir / TRAINING_STATE_FILE).exists():
        raise CheckpointError(
            f"{ckpt_dir} keeps no {TRAINING_STATE_FILE}, so no raw weights: evaluate it without --raw-weights"
        )
    state = load_training_state(ckpt_dir)
    if state.get("ema") is None or state.get("model") is None:
        raise CheckpointError(
            f"{ckpt_dir} was trained without EMA: its {MODEL_FILE} holds the raw weights already; "
            "drop --raw-weights"
        )
    return state["model"]


def _raise_if_non_finite(state: dict[str, torch.Tensor], what: str) -> None:
    """Raise `NonFiniteWeightsError` naming the first floating tensor of `state` with a NaN or inf."""
    floats = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not floats:
        return
    # One reduction and one host sync for the whole state dict, not one per tensor.
    flags = torch.stack([torch.isfinite(v).all() for v in floats.values()])
    if bool(flags.all()):
        return
    key = list(floats)[int((~flags).nonzero()[0])]
    bad = floats[key][~torch.isfinite(floats[key])]
    raise NonFiniteWeightsError(
        f"{what} are not finite ({key} holds {bad.numel()} values like {bad[0].item()})"
    )


def _last_note(run_dir: Path) -> str:
    last = latest_checkpoint(run_dir)
    return f"the newest checkpoint is {last.name}" if last is not None else "no checkpoint was saved yet"
