"""Evaluation speed: episodes/s and env steps/s of `eval_policy`, as a ratio to the raw env ceiling.

    python benchmarks/bench_eval.py [--repeats 3] [--checkpoint RUN_OR_CKPT_DIR]

Rows: (a) the random policy on the keypoints and pixels envs, n_envs 1/4/8/16, sync and async, each with
the ceiling measured on the same env, alternating with the evaluation runs (`paired_row`); (b) with
`--checkpoint`, a Diffusion Policy checkpoint with DDPM 100 steps and DDIM 10 steps; (c) slot utilization
and wall time of the fixed-batch, refill and aligned-refill schedules on the same checkpoint. Writes
benchmarks/results/<--results>.json (default eval.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench_envs import RecordingVectorEnv, raw_steps_per_s, replay_steps_per_s
from common import RESULTS_DIR, keep_previous_rows, load_env, print_table, save_results

from lerobot.checkpoints.run import load_run_policy
from lerobot.checkpoints.run_layout import resolve_checkpoint_dir
from lerobot.cli.compose import checkpoint_config
from lerobot.config import env_config
from lerobot.envs import make_env
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.rollout import eval_policy


def eval_rate(
    env_cfg, policy, n_envs: int, use_async: bool, n_episodes: int, schedule: str = "refill_aligned"
) -> dict:
    """One `eval_policy` run; returns its aggregated metrics."""
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        return eval_policy(env, policy, n_episodes, start_seed=0, progress=False, schedule=schedule)[
            "aggregated"
        ]
    finally:
        env.close()


def paired_row(
    policy_name: str, env_cfg, policy, n_envs: int, use_async: bool, n_episodes: int, repeats: int
) -> dict:
    """Alternate the ceiling and `eval_policy` on one env, `repeats` times each.

    All run on the same env object (copy=False, as `eval_policy` gets it) and alternate, so a load change
    on this shared machine hits both sides of a pair. The ceiling replays the resets and actions of a
    first, untimed evaluation (`replay_steps_per_s`: the same episodes, env work only); `ratio` is the
    median of the per-pair ratios to it. `ratio_random_actions` is the same against
    `raw_steps_per_s` (other random actions from seed 0 with autoresets: other episodes, whose physics
    costs differ), the ceiling of earlier versions of this benchmark.
    """
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    # As many env steps as the evaluation at most (full-length episodes), autoresets included.
    env_steps = n_episodes * (env_cfg.max_episode_steps + 1)
    replays, randoms, runs = [], [], []
    try:
        recorder = RecordingVectorEnv(env)
        eval_policy(recorder, policy, n_episodes, start_seed=0, progress=False)  # also a warm-up
        for _ in range(repeats):
            replays.append(replay_steps_per_s(env, recorder.calls))
            randoms.append(raw_steps_per_s(env, env_steps))
            runs.append(eval_policy(env, policy, n_episodes, start_seed=0, progress=False)["aggregated"])
    finally:
        env.close()
    ratios = [run["env_steps_per_s"] / ceiling for run, ceiling in zip(runs, replays)]
    return {
        "policy": policy_name,
        "env": env_cfg.name,
        "n_envs": n_envs,
        "mode": "async" if use_async else "sync",
        "episodes_per_s": statistics.median(1.0 / run["eval_ep_s"] for run in runs),
        "steps_per_s": statistics.median(run["env_steps_per_s"] for run in runs),
        "ceiling_steps_per_s": statistics.median(replays),
        "ratio": statistics.median(ratios),
        "ratio_runs": ratios,
        "random_actions_steps_per_s": statistics.median(randoms),
        "ratio_random_actions": statistics.median(
            run["env_steps_per_s"] / ceiling for run, ceiling in zip(runs, randoms)
        ),
    }


def random_rows(n_envs_list: list[int], repeats: int) -> list[dict]:
    """The random policy: what `eval_policy` itself costs next to the env."""
    rows = []
    for env_name in ("pusht_keypoints", "pusht"):
        env_cfg = load_env(env_name)
        policy = make_policy(make_policy_config({"name": "random"}, env_cfg))
        for n_envs in n_envs_list:
            # Whole batches of 300-step episodes, at least as many env steps as the ceiling's 1500.
            n_episodes = n_envs * math.ceil(5 / n_envs)
            for use_async in (False, True):
                rows.append(paired_row("random", env_cfg, policy, n_envs, use_async, n_episodes, repeats))
                print_table(rows[-1:], COLUMNS)
    return rows


def diffusion_rows(checkpoint: Path, n_envs_list: list[int], episode_steps: int) -> list[dict]:
    """Diffusion Policy with DDPM 100 and DDIM 10 steps, one episode per env (one pair per row: slow)."""
    rows = []
    ckpt = resolve_checkpoint_dir(checkpoint)
    for sampler, steps in (("DDPM", 100), ("DDIM", 10)):
        overrides = [
            f"policy.inference_scheduler={sampler}",
            f"policy.num_inference_steps={steps}",
            f"env.max_episode_steps={episode_steps}",
        ]
        cfg = checkpoint_config(ckpt, overrides)
        policy, _ = load_run_policy(ckpt, cfg=cfg)
        env_cfg = env_config(cfg)
        for n_envs in n_envs_list:
            for use_async in (False, True):
                name = f"diffusion {sampler}{steps}"
                rows.append(paired_row(name, env_cfg, policy, n_envs, use_async, n_envs, repeats=1))
                print_table(rows[-1:], COLUMNS)
    return rows


def utilization_rows(checkpoint: Path, n_envs: int, n_episodes: int) -> list[dict]:
    """Fixed batches vs refill vs aligned refill with a policy whose episodes end at different steps."""
    ckpt = resolve_checkpoint_dir(checkpoint)
    cfg = checkpoint_config(ckpt, ["policy.inference_scheduler=DDIM", "policy.num_inference_steps=10"])
    policy, _ = load_run_policy(ckpt, cfg=cfg)
    rows = []
    for schedule in ("batch", "refill", "refill_aligned"):
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


COLUMNS = [
    "policy", "env", "n_envs", "mode", "episodes_per_s", "steps_per_s", "ceiling_steps_per_s", "ratio",
    "ratio_random_actions",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-envs", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--checkpoint", type=Path, help="a Diffusion Policy run or checkpoint directory")
    parser.add_argument(
        "--dp-episode-steps", type=int, default=64, help="episode length for the Diffusion Policy rows"
    )
    parser.add_argument("--skip-random", action="store_true")
    parser.add_argument("--results", default="eval", help="results/<name>.json to write")
    args = parser.parse_args()
    rows = [] if args.skip_random else random_rows(args.n_envs, args.repeats)
    utilization = []
    if args.checkpoint is not None:
        rows += diffusion_rows(args.checkpoint, args.n_envs, args.dp_episode_steps)
        utilization = utilization_rows(args.checkpoint, n_envs=10, n_episodes=50)
    print()
    print_table(rows, COLUMNS)
    previous = RESULTS_DIR / f"{args.results}.json"
    if not utilization and previous.exists():
        utilization = json.loads(previous.read_text()).get("utilization", [])
    # A run of some env counts (`--n-envs 1`) replaces those rows and keeps the others.
    rows = keep_previous_rows(args.results, rows, key=("policy", "env", "n_envs", "mode"))
    print(f"wrote {save_results(args.results, rows, {'utilization': utilization})}")


if __name__ == "__main__":
    main()
