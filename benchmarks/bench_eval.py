"""Evaluation speed: episodes/s and env steps/s of `eval_policy`, as a ratio to the raw env ceiling.

    python benchmarks/bench_eval.py [--repeats 3] [--checkpoint RUN_OR_CKPT_DIR]

Rows: (a) the random policy on the keypoints and pixels envs, n_envs 1/4/8/16, sync and async, each with
the ceiling (bench_envs.py) measured in the same run; (b) with `--checkpoint`, a Diffusion Policy checkpoint
with DDPM 100 steps and DDIM 10 steps; (c) slot utilization of the fixed-batch schedule vs refill on the
same checkpoint. Writes benchmarks/results/eval.json.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from bench_envs import ceiling_steps_per_s
from common import RESULTS_DIR, load_env, median_of, print_table, save_results

from lerobot.cli import checkpoint_config
from lerobot.config import env_config
from lerobot.envs import make_env
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.rollout import eval_policy
from lerobot.training.checkpoint import load_policy, resolve_checkpoint_dir


def eval_rate(
    env_cfg, policy, n_envs: int, use_async: bool, n_episodes: int, schedule: str = "refill"
) -> dict:
    """One `eval_policy` run; returns its aggregated metrics."""
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        return eval_policy(env, policy, n_episodes, start_seed=0, progress=False, schedule=schedule)[
            "aggregated"
        ]
    finally:
        env.close()


def _median_eval(env_cfg, policy, n_envs, use_async, n_episodes, repeats, schedule="refill") -> dict:
    runs = [eval_rate(env_cfg, policy, n_envs, use_async, n_episodes, schedule) for _ in range(repeats)]
    runs.sort(key=lambda r: r["env_steps_per_s"])
    return runs[len(runs) // 2]


def random_rows(n_envs_list: list[int], repeats: int) -> list[dict]:
    rows = []
    for env_name in ("pusht_keypoints", "pusht"):
        env_cfg = load_env(env_name)
        policy = make_policy(make_policy_config({"name": "random"}, env_cfg))
        for n_envs in n_envs_list:
            for use_async in (False, True):
                ceiling, _ = median_of(
                    functools.partial(ceiling_steps_per_s, env_cfg, n_envs, use_async), repeats
                )
                agg = _median_eval(env_cfg, policy, n_envs, use_async, n_envs, repeats)
                rows.append(
                    {
                        "policy": "random",
                        "env": env_name,
                        "n_envs": n_envs,
                        "mode": "async" if use_async else "sync",
                        "episodes_per_s": 1.0 / agg["eval_ep_s"],
                        "steps_per_s": agg["env_steps_per_s"],
                        "ceiling_steps_per_s": ceiling,
                        "ratio": agg["env_steps_per_s"] / ceiling,
                    }
                )
                print_table(rows[-1:], COLUMNS)
    return rows


def diffusion_rows(checkpoint: Path, n_envs_list: list[int], episode_steps: int) -> list[dict]:
    rows = []
    ckpt = resolve_checkpoint_dir(checkpoint)
    for sampler, steps in (("DDPM", 100), ("DDIM", 10)):
        overrides = [
            f"policy.inference_scheduler={sampler}",
            f"policy.num_inference_steps={steps}",
            f"env.max_episode_steps={episode_steps}",
        ]
        cfg = checkpoint_config(ckpt, overrides)
        policy, _ = load_policy(ckpt, cfg=cfg)
        env_cfg = env_config(cfg)
        for n_envs in n_envs_list:
            for use_async in (False, True):
                ceiling = ceiling_steps_per_s(env_cfg, n_envs, use_async)
                agg = eval_rate(env_cfg, policy, n_envs, use_async, n_envs)
                rows.append(
                    {
                        "policy": f"diffusion {sampler}{steps}",
                        "env": env_cfg.name,
                        "n_envs": n_envs,
                        "mode": "async" if use_async else "sync",
                        "episodes_per_s": 1.0 / agg["eval_ep_s"],
                        "steps_per_s": agg["env_steps_per_s"],
                        "ceiling_steps_per_s": ceiling,
                        "ratio": agg["env_steps_per_s"] / ceiling,
                    }
                )
                print_table(rows[-1:], COLUMNS)
    return rows


def utilization_rows(checkpoint: Path, n_envs: int, n_episodes: int) -> list[dict]:
    """Fixed batches vs refill with a policy whose episodes end at different steps (successes end early)."""
    ckpt = resolve_checkpoint_dir(checkpoint)
    cfg = checkpoint_config(ckpt, ["policy.inference_scheduler=DDIM", "policy.num_inference_steps=10"])
    policy, _ = load_policy(ckpt, cfg=cfg)
    rows = []
    for schedule in ("batch", "refill"):
        agg = eval_rate(env_config(cfg), policy, n_envs, False, n_episodes, schedule)
        rows.append(
            {
                "schedule": schedule,
                "n_envs": n_envs,
                "n_episodes": n_episodes,
                "slot_utilization": agg["slot_utilization"],
                "eval_s": agg["eval_s"],
                "pc_success": agg["pc_success"],
            }
        )
        print_table(
            rows[-1:], ["schedule", "n_envs", "n_episodes", "slot_utilization", "eval_s", "pc_success"]
        )
    return rows


COLUMNS = ["policy", "env", "n_envs", "mode", "episodes_per_s", "steps_per_s", "ceiling_steps_per_s", "ratio"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-envs", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--checkpoint", type=Path, help="a Diffusion Policy run or checkpoint directory")
    parser.add_argument(
        "--dp-episode-steps", type=int, default=64, help="episode length for the Diffusion Policy rows"
    )
    parser.add_argument("--skip-random", action="store_true")
    args = parser.parse_args()
    rows = [] if args.skip_random else random_rows(args.n_envs, args.repeats)
    utilization = []
    if args.checkpoint is not None:
        rows += diffusion_rows(args.checkpoint, args.n_envs, args.dp_episode_steps)
        utilization = utilization_rows(args.checkpoint, n_envs=10, n_episodes=50)
    print()
    print_table(rows, COLUMNS)
    # Rows of the policies not run this time are kept from the previous results file.
    previous = RESULTS_DIR / "eval.json"
    if previous.exists():
        old = json.loads(previous.read_text())
        ran = {r["policy"] for r in rows}
        rows = [r for r in old["rows"] if r["policy"] not in ran] + rows
        utilization = utilization or old.get("utilization", [])
    print(f"wrote {save_results('eval', rows, {'utilization': utilization})}")


if __name__ == "__main__":
    main()
