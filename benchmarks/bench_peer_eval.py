"""Evaluation end to end: the paper-size image Diffusion Policy against LeRobot's, episodes per second in one run.

    cd benchmarks && python bench_peer_eval.py [--n-envs 8] [--episodes 8] [--episode-steps 200] \
        [--ddim-steps 10] [--repeats 3] [--threads 2] [--peer-python $LEROBOT_VENV/bin/python]

Both sides evaluate the same model (the paper's PushT image setup, random weights: a trained model's
compute; episodes then run to the step cap) on the same PushT envs (96x96 frames, `--n-envs` sync envs,
episodes capped at `--episode-steps`, DDIM with `--ddim-steps`), with no video. The peer is LeRobot 0.6.x's
`eval_policy` (`peer_lerobot_eval.py`, run by a Python with LeRobot and gym-pusht). Ours is this project's
`eval_policy` on `policy=diffusion env=pusht` in two settings: fp32 (the defaults) and `inference.fast=true
inference.dtype=bfloat16`, after an untimed warm-up evaluation of each. Per round LeRobot, then each of ours,
so that load drift hits every column alike; ratios are per round, then the median. Each side times its
`eval_policy` call alone: building the policy and the envs is outside, and so is entering
`lerobot.accel.accelerated` (the fast path's one-time weight preparation, which `scripts/eval.py` pays once
per evaluation). Writes results/peer_eval_<cpu vendor>.json, one row per `--n-envs` (a run keeps the rows
of the other env counts).
"""

from __future__ import annotations

# isort: off
import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# isort: on
import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
from bench_inference import synthetic_stats
from bench_peer import DEFAULT_PEER_PYTHON, cpu_vendor
from common import keep_previous_rows, load_env, machine_info, print_table, save_results

from lerobot.accel import accelerated
from lerobot.config import InferenceConfig
from lerobot.envs import make_env
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.rollout import eval_policy

SETTINGS = {
    "fp32": InferenceConfig(),
    "fast bf16": InferenceConfig(fast=True, dtype="bfloat16"),
}


def peer_seconds(python: Path, threads: int, n_envs: int, episodes: int, steps: int, ddim: int) -> float:
    """Wall time of LeRobot's `eval_policy`, from one run of `peer_lerobot_eval.py`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = Path(__file__).with_name("peer_lerobot_eval.py")
    args = [str(python), str(script), *map(str, (threads, n_envs, episodes, steps, ddim))]
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("seconds "))
    return float(line.split()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8])
    parser.add_argument("--episodes", type=int, default=None, help="default: one per env")
    parser.add_argument("--episode-steps", type=int, default=200)
    parser.add_argument("--ddim-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    args = parser.parse_args(argv)
    if not args.peer_python.is_file():
        raise SystemExit(f"{args.peer_python} not found: set LEROBOT_VENV or pass --peer-python")
    torch.set_num_threads(args.threads)
    env_cfg = load_env("pusht")
    env_cfg.max_episode_steps = args.episode_steps
    policy_cfg = make_policy_config(
        {"name": "diffusion", "inference_scheduler": "DDIM", "num_inference_steps": args.ddim_steps}, env_cfg
    )
    torch.manual_seed(0)
    policy = make_policy(policy_cfg, synthetic_stats(policy_cfg)).eval()

    rows = []
    for n_envs in args.n_envs:
        episodes = args.episodes or n_envs
        env = make_env(env_cfg, n_envs, use_async=False, copy=False)
        times: dict[str, list[float]] = {"lerobot": [], **{name: [] for name in SETTINGS}}
        try:
            for settings in SETTINGS.values():  # warm-up: first-call allocations
                with accelerated(policy, settings):
                    eval_policy(env, policy, n_envs, start_seed=100000, progress=False)
            for _ in range(args.repeats):
                times["lerobot"].append(
                    peer_seconds(
                        args.peer_python, args.threads, n_envs, episodes, args.episode_steps, args.ddim_steps
                    )
                )
                for name, settings in SETTINGS.items():
                    with accelerated(policy, settings):
                        start = time.perf_counter()
                        eval_policy(env, policy, episodes, start_seed=100000, progress=False)
                        times[name].append(time.perf_counter() - start)
        finally:
            env.close()
        row = {"n_envs": n_envs, "episodes": episodes, "episode_steps": args.episode_steps}
        for name, values in times.items():
            row[f"{name} s"] = statistics.median(values)
        for name in SETTINGS:
            row[f"{name} x"] = statistics.median(
                peer / ours for peer, ours in zip(times["lerobot"], times[name], strict=True)
            )
        row["runs"] = times
        rows.append(row)
        print_table([{k: v for k, v in row.items() if k != "runs"}], [k for k in row if k != "runs"])
    name = f"peer_eval_{cpu_vendor(machine_info()['cpu'])}"
    extra = {"ddim_steps": args.ddim_steps, "repeats": args.repeats, "threads": args.threads}
    print(f"wrote {save_results(name, keep_previous_rows(name, rows, key='n_envs'), extra)}")


if __name__ == "__main__":
    main()
