"""The ceiling: raw vector-env steps per second with random actions, no policy, no bookkeeping.

    python benchmarks/bench_envs.py [--repeats 3] [--n-envs 1 2 4 8 16]

Writes benchmarks/results/envs.json and prints a table. `raw_steps_per_s` is imported by bench_eval.py,
which measures the ceiling on the very env it evaluates on, alternating with the evaluation runs.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
from common import load_env, median_of, print_table, save_results
from gymnasium.vector import VectorEnv

from lerobot.config import EnvConfig
from lerobot.envs import make_env


def raw_steps_per_s(env: VectorEnv, env_steps: int = 1500, seed: int = 0) -> float:
    """Env steps per second of `env.step` alone on `env` (actions sampled beforehand), ~`env_steps` steps."""
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    low, high = env.single_action_space.low, env.single_action_space.high
    n_vector_steps = max(env_steps // env.num_envs, 30)
    actions = rng.uniform(low, high, size=(n_vector_steps, env.num_envs, *low.shape)).astype(np.float32)
    env.step(actions[0])  # warm-up (first step of async workers)
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    return n_vector_steps * env.num_envs / (time.perf_counter() - start)


def ceiling_steps_per_s(env_cfg: EnvConfig, n_envs: int, use_async: bool, env_steps: int = 1500) -> float:
    """`raw_steps_per_s` of a new vector env built as `eval_policy` gets it (copy=False)."""
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        return raw_steps_per_s(env, env_steps)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-envs", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--envs", nargs="+", default=["pusht_keypoints", "pusht"])
    args = parser.parse_args()
    rows = []
    for env_name in args.envs:
        env_cfg = load_env(env_name)
        for n_envs in args.n_envs:
            for use_async in (False, True):
                median, values = median_of(
                    functools.partial(ceiling_steps_per_s, env_cfg, n_envs, use_async), args.repeats
                )
                rows.append(
                    {
                        "env": env_name,
                        "n_envs": n_envs,
                        "mode": "async" if use_async else "sync",
                        "steps_per_s": median,
                        "runs": values,
                    }
                )
                print_table(rows[-1:], ["env", "n_envs", "mode", "steps_per_s"])
    print()
    print_table(rows, ["env", "n_envs", "mode", "steps_per_s"])
    print(f"wrote {save_results('envs', rows)}")


if __name__ == "__main__":
    main()
