"""`training_state.pt`, read safely: tensors and plain containers only, never code.

A checkpoint may come from someone else, and `checksums.json` proves only that its files are the ones written
with it, not who wrote them: a pickle can carry any object whose unpickling runs a command. So the training
state is read with `torch.load(weights_only=True)`, which rebuilds tensors, numbers, strings, lists, tuples
and dicts and refuses everything else. Versions before this one stored numpy's random state as a numpy array,
which such a load refuses; `convert_training_state` rewrites such a file in today's layout, and it runs only
when the user says they trust the file (`python scripts/convert_checkpoint.py DIR --trust-pickle`).
"""

from __future__ import annotations

import json
import logging
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot.errors import CheckpointError, UnsafeCheckpointError
from lerobot.runtime.checksums import CHECKSUMS_FILE, file_sha256, read_checksums, verify_checksum
from lerobot.runtime.files import atomic_write

log = logging.getLogger(__name__)

TRAINING_STATE_FILE = "training_state.pt"
CONVERT_SCRIPT = "python scripts/convert_checkpoint.py"


def _refused_by_safe_load(error: Exception) -> bool:
    """Whether `torch.load(weights_only=True)` failed because the file holds objects it does not rebuild (as
    opposed to a damaged file)."""
    return isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error)


def _refused_object(error: Exception) -> str:
    """The object a safe load refused, as torch names it (`numpy._core.multiarray._reconstruct`), or a
    generic phrase."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else "an object other than tensors and plain containers"


def safe_load_state(path: Path, damaged_hint: str) -> dict[str, Any]:
    """The state saved in `path` by `torch.save`, loaded with `weights_only=True`.

    Raises `CheckpointError` in one line: for a damaged file (with `damaged_hint`, what else to use), and for a
    file that holds other objects, naming the command that converts it once the user trusts it.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        if _refused_by_safe_load(e):
            refused = _refused_object(e)
            raise UnsafeCheckpointError(
                f"{path} holds objects that a safe load does not run ({refused}): loading it could "
                "run code, so it was not loaded. A checkpoint of an older version stores its random state "
                "that way: if you made this checkpoint yourself, convert it once with "
                f"`{CONVERT_SCRIPT} {path.parent} --trust-pickle`; never for a file from someone you do not "
                "trust",
                refused,
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is corrupt ({first}); {damaged_hint}") from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} is corrupt (it holds a {type(state).__name__}, not a dict); {damaged_hint}"
        )
    return state


def _plain_numpy_state(state: Any) -> Any:
    """numpy's random state as `np.random.get_state()` returns it (a tuple holding an array) -> the plain
    layout of `lerobot.random_state.get_rng_state`; any other value is returned unchanged."""
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], np.ndarray)):
        return state
    name, key, pos, has_gauss, gauss = state
    return {
        "bit_generator": str(name),
        "key": torch.from_numpy(np.asarray(key).astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def convert_training_state(ckpt_dir: Path) -> bool:
    """Rewrite `ckpt_dir/training_state.pt` of an older version so that a safe load reads it; True when it was
    rewritten, False when it already loads safely.

    This unpickles the file with `weights_only=False`, which runs whatever code it holds: call it only for a
    checkpoint the user made (the script asks for `--trust-pickle`). The file's checksum is verified first;
    the new file replaces the old one atomically and its checksum is recorded. Raises `CheckpointError`
    (leaving the file as it was) when the state still holds objects a safe load refuses.
    """
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / TRAINING_STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir} holds no {TRAINING_STATE_FILE}: there is nothing to convert")
    verify_checksum(ckpt_dir, TRAINING_STATE_FILE)
    try:
        safe_load_state(path, "it cannot be converted")
        return False
    except UnsafeCheckpointError:
        pass
    state = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(state, dict) and isinstance(state.get("rng"), dict):
        state["rng"] = {**state["rng"], "numpy": _plain_numpy_state(state["rng"].get("numpy"))}

    def write(tmp: Path) -> None:
        torch.save(state, tmp)
        safe_load_state(tmp, "")  # the converted file must load safely before it replaces the old one

    try:
        atomic_write(path, write, fsync=True)
    except UnsafeCheckpointError as e:
        raise CheckpointError(
            f"{path} cannot be converted: besides the random state of an older version it holds {e.refused}, "
            "which this version does not store; it was left as it was"
        ) from None
    sums = read_checksums(ckpt_dir)
    if sums is not None:
        sums[TRAINING_STATE_FILE] = file_sha256(path)
        text = json.dumps({"sha256": sums}, indent=1, sort_keys=True)
        atomic_write(ckpt_dir / CHECKSUMS_FILE, lambda tmp: tmp.write_text(text), fsync=True)
    log.info("converted %s: it now loads without running code", path)
    return True
