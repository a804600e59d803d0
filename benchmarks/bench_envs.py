"""The ceiling: raw vector-env steps per second with random actions, no policy, no bookkeeping.

    python benchmarks/bench_envs.py [--repeats 3] [--n-envs 1 2 4 8 16]

Writes benchmarks/results/envs.json and prints a table. bench_eval.py measures the ceiling on the very env
it evaluates on, alternating with the evaluation runs: `replay_steps_per_s` re-makes the evaluation's own
resets and steps (`RecordingVectorEnv`), `raw_steps_per_s` steps other random actions.
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
from typing import Any

import numpy as np
from common import load_env, median_of, print_table, save_results
from gymnasium.vector import VectorEnv, VectorWrapper

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


class RecordingVectorEnv(VectorWrapper):
    """Passes every call through to `env` and records the resets and steps made, for `replay_steps_per_s`."""

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        self.calls: list[tuple[str, Any, Any]] = []  # ("reset", seed, options) or ("step", actions, None)

    def reset(self, *, seed=None, options=None):
        """Record, then reset the wrapped env."""
        self.calls.append(("reset", copy.deepcopy(seed), copy.deepcopy(options)))
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        """Record a copy of the actions, then step the wrapped env."""
        self.calls.append(("step", np.array(actions), None))
        return self.env.step(actions)


def replay_steps_per_s(env: VectorEnv, calls: list[tuple[str, Any, Any]]) -> float:
    """Env steps per second of `env` re-making the recorded `calls`: the same seeds, actions and resets.

    The ceiling of the evaluation that made the calls: its env work alone, with nothing else in the loop.
    A PushT step's cost depends on the contacts of its episode, so a ceiling measured over other episodes
    (other seeds or actions) would measure a different amount of work.
    """
    n_steps = 0
    start = time.perf_counter()
    for kind, arg, options in calls:
        if kind == "step":
            env.step(arg)
            n_steps += 1
        else:  # gymnasium pops `reset_mask` from the options it gets: give it a copy
            env.reset(seed=arg, options=None if options is None else dict(options))
    return n_steps * env.num_envs / (time.perf_counter() - start)


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
