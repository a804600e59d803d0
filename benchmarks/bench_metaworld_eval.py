"""Multi-task evaluation on MetaWorld against the raw vector env it runs on.

    python benchmarks/bench_metaworld_eval.py [--tasks mt10] [--slots 4 10] [--episodes 5] [--repeats 3]

For each slot count: `raw_steps_per_s` steps a sync vector env of that many MetaWorld slots with random
actions (no policy, no bookkeeping; one task per slot, the ceiling), `eval_steps_per_s` is the batched
multi-task evaluation (`eval_policy` over every task x `--episodes` episodes, slots refilled across tasks;
`random` actions show the evaluation's own cost, `metaworld_expert` a real policy's) in env steps of
evaluated episodes per second, with its wall time. Medians of
`--repeats` runs, alternating the two. Writes benchmarks/results/metaworld_eval.json.
"""

from __future__ import annotations

import argparse
import time

from bench_envs import raw_steps_per_s
from common import load_env, median_of, print_table, save_results

from lerobot.envs import make_env
from lerobot.envs.factory import env_task_names
from lerobot.envs.tasks import episode_plan
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.rollout import eval_policy


def _evaluate(env, policy, plan, walls: list[float]) -> float:
    """Env steps per second of evaluated episodes of one `eval_policy` run over `plan`; its wall time joins
    `walls`."""
    start = time.perf_counter()
    result = eval_policy(env, policy, len(plan), plan=plan, progress=False)
    walls.append(time.perf_counter() - start)
    return result["aggregated"]["env_steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mt10", help="env.task: a task, a set or a comma-separated list")
    parser.add_argument("--slots", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--episodes", type=int, default=5, help="episodes per task")
    parser.add_argument("--policies", nargs="+", default=["random", "metaworld_expert"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    task = args.tasks.split(",") if "," in args.tasks else args.tasks
    env_cfg = load_env("metaworld", task=task)
    plan = episode_plan(args.episodes, 100_000, env_task_names(env_cfg))
    rows = []
    for slots in args.slots:
        env = make_env(env_cfg, slots, copy=False)
        try:
            raw, raws = median_of(lambda env=env: raw_steps_per_s(env, env_steps=3000), args.repeats)
            for name in args.policies:
                policy = make_policy(make_policy_config({"name": name}, env_cfg))
                walls: list[float] = []
                steps, all_steps = median_of(
                    lambda env=env, policy=policy, walls=walls: _evaluate(env, policy, plan, walls),
                    args.repeats,
                )
                rows.append(
                    {
                        "tasks": args.tasks,
                        "policy": name,
                        "episodes": len(plan),
                        "slots": slots,
                        "raw_steps_per_s": raw,
                        "eval_steps_per_s": steps,
                        "eval_over_raw": steps / raw,
                        "eval_wall_s": sorted(walls)[len(walls) // 2],
                        "raw_runs": raws,
                        "eval_runs": all_steps,
                    }
                )
        finally:
            env.close()
    columns = ["tasks", "policy", "episodes", "slots", "raw_steps_per_s", "eval_steps_per_s", "eval_over_raw"]
    print_table(rows, [*columns, "eval_wall_s"])
    save_results("metaworld_eval", rows)


if __name__ == "__main__":
    main()
