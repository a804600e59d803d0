"""The figures of an evaluation over its episodes: averages, success rate, 95% intervals, per-task figures.

`eval_policy` (lerobot/rollout.py) aggregates its per-episode rows with `aggregate_episodes`, and so does
the merge of episode ranges run side by side (`lerobot.evaluation.merge_eval_parts`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def aggregate_episodes(
    per_episode: list[dict[str, Any]], eval_s: float, busy_steps: int, slot_steps: int
) -> dict[str, Any]:
    """The `aggregated` figures of `eval_policy` from its per-episode rows and its timing (and `per_task`,
    see `per_task_figures`, when the rows have tasks).

    Args:
        per_episode: rows as `eval_policy` returns them (`sum_reward`, `max_reward`, `success`).
        eval_s: wall-clock seconds the episodes took.
        busy_steps: env steps that belonged to an evaluated episode.
        slot_steps: env steps taken in all, idle slots included.
    """
    max_reward = np.array([e["max_reward"] for e in per_episode], dtype=np.float64)
    successes = int(sum(bool(e["success"]) for e in per_episode))
    n = len(per_episode)
    # 95% intervals: Wilson's for the success rate (sound near 0% and 100% and for few episodes), the
    # normal approximation for the mean of max rewards (bounded in [0, 1], so it holds from a few dozen).
    success_low, success_high = wilson_interval(successes, n)
    half = 1.96 * max_reward.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
    figures = {
        "avg_sum_reward": float(np.mean([e["sum_reward"] for e in per_episode])),
        "avg_max_reward": float(max_reward.mean()),
        "avg_max_reward_ci95_low": float(max_reward.mean() - half),
        "avg_max_reward_ci95_high": float(max_reward.mean() + half),
        "pc_success": 100.0 * successes / n,
        "pc_success_ci95_low": 100.0 * success_low,
        "pc_success_ci95_high": 100.0 * success_high,
        "n_episodes": n,
        "eval_s": eval_s,
        "eval_ep_s": eval_s / len(per_episode),
        "env_steps": int(busy_steps),
        "env_steps_per_s": busy_steps / eval_s if eval_s > 0 else math.nan,
        "slot_utilization": busy_steps / slot_steps if slot_steps else math.nan,
    }
    if "task" in per_episode[0]:
        figures["per_task"] = per_task_figures(per_episode)
    return figures


def per_task_figures(per_episode: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per task of a multi-task evaluation (rows with a `task`), in the order tasks first appear: its
    success rate with Wilson's 95% interval, average max and sum reward, mean steps and episode count.

    The overall `pc_success` of a plan with as many episodes per task is the mean over tasks of these."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in per_episode:
        by_task.setdefault(row["task"], []).append(row)
    figures = {}
    for task, rows in by_task.items():
        successes, n = sum(bool(r["success"]) for r in rows), len(rows)
        low, high = wilson_interval(successes, n)
        figures[task] = {
            "pc_success": 100.0 * successes / n,
            "pc_success_ci95_low": 100.0 * low,
            "pc_success_ci95_high": 100.0 * high,
            "avg_max_reward": float(np.mean([r["max_reward"] for r in rows])),
            "avg_sum_reward": float(np.mean([r["sum_reward"] for r in rows])),
            "avg_steps": float(np.mean([r["n_steps"] for r in rows])),
            "n_episodes": n,
        }
    return figures


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate `successes / n` (fractions; `z` = 1.96 for 95%)."""
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)
