"""What a step timeout costs an async evaluation: gymnasium's polled timeout against the env watchdog's.

    python benchmarks/bench_step_timeout.py [--envs 4 8] [--steps 1000] [--repeats 5]

Async `pusht_keypoints` envs step with random actions, in turn: without a timeout; with gymnasium's
(`step_wait(timeout=120)`, which polls every worker's pipe before reading it); with the watchdog's, as the
rollout steps (`worker_call(..., polled=False)` around `step_wait()`: a deadline set per call, checked by a
thread). Prints the median env-steps/s of each, and the median CPU time the evaluating process itself spends
per vector step (the cost of the timeout, measured apart from the workers and from other processes' load);
writes `benchmarks/results/step_timeout.json`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import load_env, print_table, save_results

from lerobot.envs import make_env
from lerobot.envs.faults import Watchdog, close_now, worker_call

MODES = ("none", "polled", "watchdog")


def run_steps(env, mode: str, steps: int, watchdog: Watchdog) -> tuple[float, float]:
    """Env-steps/s of `steps` vector steps of `env` with the step timeout of `mode` (120 s), and this
    process's CPU microseconds per vector step."""
    actions = np.random.default_rng(0).uniform(100, 400, (steps, env.num_envs, 2)).astype(np.float32)
    start, cpu = time.perf_counter(), time.process_time()
    for action in actions:
        if mode == "none":
            env.step_async(action)
            env.step_wait()
        else:
            with worker_call(env, "step", 120.0, watchdog=watchdog, polled=mode == "polled"):
                env.step_async(action)
                env.step_wait(timeout=120.0 if mode == "polled" else None)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return steps * env.num_envs / wall, 1e6 * cpu / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for n in args.envs:
        env = make_env(load_env("pusht_keypoints", max_episode_steps=300), n, use_async=True)
        env.reset(seed=0)
        watchdog = Watchdog(env)
        runs = {mode: [] for mode in MODES}
        try:
            for _ in range(args.repeats):  # alternating, so that a change of machine load hits every mode
                for mode in MODES:
                    runs[mode].append(run_steps(env, mode, args.steps, watchdog))
        finally:
            watchdog.close()
            close_now(env)
        row = {"envs": n}
        for mode, values in runs.items():
            row[f"{mode}_steps_per_s"] = float(np.median([rate for rate, _ in values]))
            row[f"{mode}_cpu_us_per_step"] = float(np.median([cpu for _, cpu in values]))
        rows.append(row)
    print_table(
        rows, ["envs", *(f"{m}_steps_per_s" for m in MODES), *(f"{m}_cpu_us_per_step" for m in MODES)]
    )
    print(f"wrote {save_results('step_timeout', rows, {'steps': args.steps})}")


if __name__ == "__main__":
    main()
