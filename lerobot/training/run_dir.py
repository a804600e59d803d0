"""A training run directory's lifecycle: one writer at a time (a lock) and whether a launch resumes it.

The lock is `run_dir/run.lock`, holding the owner's pid and host. It is a POSIX record lock (`fcntl.lockf`),
which the kernel drops when its process exits however it exits (even SIGKILL), and which forked worker
processes do not inherit: a lock left by a dead run is taken over with a message, a live one stops the
second launch with one line naming its owner.

The resume decision (`training.resume`): `auto` resumes from `checkpoints/last` when the directory holds one
and starts fresh otherwise, so relaunching the same command after a preemption continues the run; `true`
requires a checkpoint; `false` refuses a directory that holds one. A resumed run must have the config it was
started with, except for the keys of `RESUMABLE_CHANGES`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.training.checkpoint import latest_checkpoint, load_config

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
# Keys that may differ between a checkpoint's config and the launch that resumes it (a prefix ending in "."
# stands for the whole section): the step budget (extending a run; the LR schedule of the remaining steps
# then follows the new total), how often to log/save/evaluate and how evaluation runs, logging, the device,
# data loading workers, where the run and its data live, and the evaluation-only inference layer. Everything
# else shapes the trajectory of training, so a change there is a different run.
RESUMABLE_CHANGES = (
    "training.steps",
    "training.resume",
    "training.log_freq",
    "training.save_freq",
    "training.num_workers",
    "training.save_buffer",
    "training.use_async_envs",
    "training.compile",
    "eval.",
    "wandb.",
    "device",
    "output_dir",
    "job_name",
    "dataset.root",
    "dataset.cache_dir",
    "policy.inference.",
)


class RunDirError(RuntimeError):
    """The run directory cannot be used by this launch (another run writes it, or it holds another config)."""


class RunLock:
    """Exclusive ownership of a run directory by this process, recorded as `pid host` in `run.lock`."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `RunDirError` naming the live owner; take over a dead owner's lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunDirError(
                f"{self.path.parent} is in use by another training run ({_owner(self.path) or 'owner unknown'}); "
                "wait for it to end, stop it, or pick another output_dir"
            ) from None
        previous = os.pread(fd, 256, 0).decode(errors="replace").strip()
        if previous:
            log.warning("%s: taking over the lock left by a run that has ended (%s)", self.path, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Empty the lock file (a clean end leaves no owner behind) and drop the lock."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor releases the record lock
        self._fd = None


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


# Locks held by this process, by run directory, until the trainer's loop ends (`release_run_dir`) or the
# process exits (the kernel drops them then).
_held: dict[Path, RunLock] = {}


def lock_run_dir(run_dir: Path) -> None:
    """Make this process the only writer of `run_dir` (see `RunLock`); a no-op if it already is."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    lock = RunLock(run_dir)
    lock.acquire()
    _held[key] = lock


def release_run_dir(run_dir: Path) -> None:
    """Give up the lock `lock_run_dir` took (if any)."""
    lock = _held.pop(Path(run_dir).resolve(), None)
    if lock is not None:
        lock.release()


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The checkpoint this launch continues from (None: a fresh run), per `training.resume`.

    Raises `RunDirError` when the checkpoint's config differs from `cfg` in a key outside
    `RESUMABLE_CHANGES`, and when `resume` is `true` without a checkpoint or `false` with one.
    """
    mode = str(cfg.training.resume)
    last = latest_checkpoint(run_dir)
    if mode == "false":
        if last is not None:
            raise RunDirError(
                f"{run_dir} already holds checkpoints and training.resume=false; pass training.resume=auto "
                "to continue it or pick another output_dir"
            )
        return None
    if last is None:
        if mode == "true":
            raise RunDirError(f"training.resume=true but {run_dir} holds no checkpoint (checkpoints/last)")
        return None
    changed = config_changes(load_config(last), cfg)
    if changed:
        shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise RunDirError(
            f"{run_dir} holds a run with another config: {shown}{more}; relaunch with the run's settings "
            "to resume it, or pick another output_dir for a new run"
        )
    return last


def config_changes(saved: DictConfig, current: DictConfig) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for every dotted key whose value differs, outside `RESUMABLE_CHANGES`."""
    a = _flatten(OmegaConf.to_container(saved, resolve=True))
    b = _flatten(OmegaConf.to_container(current, resolve=True))
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not _resumable(k)]


def _resumable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as `{dotted.key: leaf}`; lists are leaves (compared whole)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, dict) and v else f"{prefix}{k}"))
    return out
