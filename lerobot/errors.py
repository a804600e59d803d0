"""Every error the project raises on purpose, in one place below everything else.

Each one means a problem a user can fix, and its message names the thing and the fix; the command line prints
such an error as one line and exits with status 2 (`EXPECTED_ERRORS`). Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and how to fix it."""


class RenderingError(ConfigError):
    """The OpenGL backend (`MUJOCO_GL`) cannot render here; the message names it and the backend to use."""


class DatasetError(ValueError):
    """A dataset file is missing something or is malformed; the message names the file and the problem."""


class DatasetExistsError(DatasetError):
    """The directory a dataset is to be written to exists already (made before, or by another writer while
    this one wrote); nothing of it was changed."""


class DatasetNotFoundError(FileNotFoundError):
    """No dataset could be found or fetched; the message says where to put it or what to configure."""


class DeltaTimestampsError(ValueError):
    """`delta_timestamps` is malformed; the message names the feature and the offending offset."""


class EnvWorkerError(RuntimeError):
    """An async env worker died or stopped answering (its env is closed and its workers killed)."""


class NonFiniteActionError(ValueError):
    """The policy returned a NaN or infinite action; it was not sent to the env.

    Where `Policy.select_action` found it: `slot`, the env slot (batch row); `steps_ahead`, how many steps
    after the current one that action of the new chunk was for (0: the action of this step); `action`, its
    values. None/0/None where not known."""

    def __init__(
        self, message: str, slot: int | None = None, steps_ahead: int = 0, action: list[float] | None = None
    ):
        super().__init__(message)
        self.slot, self.steps_ahead, self.action = slot, steps_ahead, action


class PretrainedError(ValueError):
    """A pretrained directory or repo is missing, unreadable or in a format/config this project cannot load."""


class InstallError(RuntimeError):
    """An installed package does not work with the others (a torchvision built for another torch); the
    message names both versions and the reinstall that fixes it."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not fit the policy/env it is loaded into."""


class NonFiniteWeightsError(CheckpointError):
    """Weights hold NaN or infinite values (the training diverged): they are neither saved nor loaded."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds Python objects that loading would have to run (not only tensors and plain
    containers): it is not loaded. `refused` names the first such object."""

    def __init__(self, message: str, refused: str):
        super().__init__(message)
        self.refused = refused


class ChecksumError(RuntimeError):
    """A checkpoint file's bytes differ from the ones it was saved with, or `checksums.json` is unreadable."""


class RunDirError(RuntimeError):
    """The run directory cannot be used by this launch (another run writes it, or it holds another config)."""


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite.

    `update`, when known: the number (1-based, counted in this process) of the first update whose loss was not
    finite. Found at log time (`StepMetrics`), it tells which weights gave that loss: those after update
    `update - 1`.
    """

    def __init__(self, message: str, update: int | None = None):
        super().__init__(message)
        self.update = update


# What the command line reports as one line (`error: ...`) and exit status 2.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    DatasetError,
    DatasetNotFoundError,
    DeltaTimestampsError,
    EnvWorkerError,
    NonFiniteActionError,
    PretrainedError,
    InstallError,
    CheckpointError,
    RunDirError,
    TrainingDivergedError,
    FileNotFoundError,
)


def exit_with_error(message: str) -> NoReturn:
    """End a small script (`scripts/plot_runs.py`, `scripts/compare_evals.py`) on input it cannot use as the
    commands do: `error: <message>` on stderr, exit status 2. The `SystemExit` raised reads as `message`."""
    print(f"error: {message}", file=sys.stderr)
    stop = SystemExit(message)
    stop.code = 2  # what the interpreter exits with; the message is printed already
    raise stop
