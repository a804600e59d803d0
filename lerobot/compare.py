"""Paired comparison of evaluations run on the same initial states.

Two evaluations with the same `eval.start_seed` reset episode `i` with the same seed, so episode `i` of
each starts from the same PushT state. Differences taken episode by episode then cancel how hard each
initial state is, which independent intervals cannot: two rows whose intervals overlap can still differ
clearly when paired. Several pairs (one per training seed, say) pool into one estimate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lerobot.constants import EVAL_INFO_FILE


def load_episodes(path: Path | str) -> dict[tuple[str | None, int], dict[str, Any]]:
    """An evaluation's per-episode rows keyed by (task, reset seed) (task None for a single-task env); `path`
    is `eval_info.json` or its directory. Raises `FileNotFoundError` or `ValueError` naming the file."""
    path = Path(path)
    file = path / EVAL_INFO_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no evaluation at {path}: expected {EVAL_INFO_FILE} (or a directory holding it), "
            "as scripts/eval.py or the trainer's evaluation writes it"
        )
    try:
        rows = json.loads(file.read_text())["per_episode"]
        episodes = {}
        for row in rows:
            float(row["max_reward"]), bool(row["success"])  # the figures compared must be there
            episodes[(row.get("task"), int(row["seed"]))] = row
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{file} is not an evaluation's {EVAL_INFO_FILE} (no per_episode rows with seed, max_reward and "
            f"success): {type(exc).__name__}: {exc}"
        ) from exc
    return episodes


def paired_difference(pairs: list[tuple[Path | str, Path | str]], z: float = 1.96) -> dict[str, float]:
    """Mean difference `other - base` of max reward and of success over the episodes both evaluations ran.

    Args:
        pairs: `(base, other)` evaluations (`eval_info.json` or its directory); each pair is matched on
            reset seeds, and all pairs' episode differences are pooled.
        z: the normal quantile of the intervals (1.96: 95%).

    Returns:
        `n_pairs`; `base_*` and `other_*` means over the paired episodes; `delta_avg_max_reward` and
        `delta_pc_success` (points) with `_ci_low`/`_ci_high` normal intervals of the paired differences.
    """
    max_base, max_other, success_base, success_other = [], [], [], []
    for base_path, other_path in pairs:
        base, other = load_episodes(base_path), load_episodes(other_path)
        seeds = sorted(base.keys() & other.keys())
        if not seeds:
            raise ValueError(
                f"{base_path} and {other_path} share no episode seed: evaluate both with the same "
                "eval.start_seed so that their episodes start from the same states"
            )
        max_base += [base[s]["max_reward"] for s in seeds]
        max_other += [other[s]["max_reward"] for s in seeds]
        success_base += [float(base[s]["success"]) for s in seeds]
        success_other += [float(other[s]["success"]) for s in seeds]
    result: dict[str, float] = {"n_pairs": len(max_base)}
    for name, base_values, other_values, scale in (
        ("avg_max_reward", max_base, max_other, 1.0),
        ("pc_success", success_base, success_other, 100.0),
    ):
        base_values, other_values = np.asarray(base_values), np.asarray(other_values)
        diff = (other_values - base_values) * scale
        half = z * diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
        result[f"base_{name}"] = float(base_values.mean() * scale)
        result[f"other_{name}"] = float(other_values.mean() * scale)
        result[f"delta_{name}"] = float(diff.mean())
        result[f"delta_{name}_ci_low"] = float(diff.mean() - half)
        result[f"delta_{name}_ci_high"] = float(diff.mean() + half)
    return result
