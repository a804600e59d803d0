"""`scripts/convert_checkpoint.py`: rewrite the training state of checkpoints of an older version so that it
loads without running code (`lerobot.checkpoints.training_state`). It unpickles the files it converts, so it
runs only with `--trust-pickle`, the user's word that they made them."""

from __future__ import annotations

import argparse
from pathlib import Path

from lerobot.checkpoints.run_layout import MODEL_FILE, list_checkpoints
from lerobot.checkpoints.training_state import TRAINING_STATE_FILE, convert_training_state
from lerobot.cli.exit import run_command
from lerobot.errors import CheckpointError, ChecksumError


def _checkpoints(path: Path) -> list[Path]:
    """The checkpoint `path` names, or every checkpoint of the run directory `path`."""
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: name a checkpoint directory or a run directory")
    if path.is_file() and path.name == TRAINING_STATE_FILE:
        return [path.parent]
    if (path / MODEL_FILE).is_file() or (path / TRAINING_STATE_FILE).is_file():
        return [path]
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"{path} holds no checkpoint: name a checkpoint directory or a run directory")
    return found


def _convert(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            f"Rewrite the {TRAINING_STATE_FILE} of checkpoints saved by an older version so that it loads "
            "without running code. Converting unpickles the file, which runs any code it carries: do it only "
            "for checkpoints you made yourself."
        ),
        epilog="example: python scripts/convert_checkpoint.py outputs/train/my_run --trust-pickle",
    )
    parser.add_argument("path", type=Path, help="a checkpoint directory, or a run directory (all of its)")
    parser.add_argument(
        "--trust-pickle", action="store_true", help="you made these files: unpickling is safe"
    )
    args = parser.parse_args(argv)
    checkpoints = _checkpoints(args.path)
    if not args.trust_pickle:
        raise CheckpointError(
            f"converting unpickles {TRAINING_STATE_FILE}, which runs any code the file carries: add "
            "--trust-pickle only if you made these checkpoints yourself; nothing was changed"
        )
    for ckpt in checkpoints:
        if not (ckpt / TRAINING_STATE_FILE).is_file():
            print(f"{ckpt}: no {TRAINING_STATE_FILE}, nothing to convert")
            continue
        try:
            converted = convert_training_state(ckpt)
        except ChecksumError as e:
            raise CheckpointError(f"{e}; it was not converted") from None
        print(f"{ckpt}: {'converted' if converted else 'already loads safely'}")
    return 0


def convert_main(argv: list[str] | None = None) -> int:
    """`scripts/convert_checkpoint.py`: errors a user can fix end as one line and exit code 2."""
    return run_command(_convert, argv)
