"""TD-MPC acting speed: today's planner (git HEAD) against the working tree's, in one process.

    python benchmarks/bench_tdmpc_eval.py [--repeats 5] [--threads 1 2] [--batch-sizes 50 8 1]
                                          [--eval-episodes 10] [--sweep]

The policy is the CPU recipe (configs/experiment/tdmpc_pusht_keypoints_cpu.yaml: 128 samples, 16 elites,
8 policy trajectories, 3 iterations, horizon 5, 256-wide MLPs) on pusht_keypoints, with random weights
(seed 0; the zero-initialised reward and Q output layers get random weights too, so that candidate values
differ and the elite selection is exercised). The baseline planner is `lerobot/policies/tdmpc/planner.py` as
committed at HEAD, loaded from `git show` into a temporary module: the measured "old" is today's code, not a
copy kept in the repository. The two planners act through the same policy object (same weights, same
`predict_action_chunk`), one swapped in for the other.

Rows:
- `plan`: `select_action` (one planning call, n_action_steps=1) on batches of 50, 8 and 1 observations, for
  each torch thread count; old and new alternate in every repeat (a load change on this shared machine hits
  both), medians of `--repeats`; `speedup` is the median of the per-repeat old/new ratios.
- `equal`: both planners from the same per-env seeds for 3 calls, with env 0 reset before the third;
  `max_abs_diff` over the actions (env units) and whether they are bit-identical.
- `eval`: `eval_policy` (the loop of scripts/eval.py) with 10 sync envs on `--eval-episodes` episodes of 50
  steps, old then new then old then new; per-episode rewards compared.
- `floor`: one planning call (batch 50, one thread) reduced to its matmuls alone, and to its ELUs' expm1
  alone: what a bit-identical planner cannot avoid (the other ops would have to be free to reach it).
- `sweep` (with --sweep): new planner's time against `ROWS_PER_BLOCK` on one thread, batch 50.

Writes benchmarks/results/tdmpc_eval.json (with `lscpu`'s CPU model and the torch version).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import common  # first: it sets OMP_WAIT_POLICY before torch loads
import torch
import torch.nn.functional as F
from torch import nn

from lerobot.cli import compose_config
from lerobot.config import env_config
from lerobot.envs import make_env
from lerobot.policies.tdmpc import planner as new_planner
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.rollout import eval_policy

REPO = Path(__file__).resolve().parents[1]
PLANNER_PATH = "lerobot/policies/tdmpc/planner.py"


def load_head_planner() -> types.ModuleType:
    """`planner.py` as committed at git HEAD, imported as module `_tdmpc_planner_head` (the measured baseline)."""
    source = subprocess.run(
        ["git", "show", f"HEAD:{PLANNER_PATH}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType("_tdmpc_planner_head")
    module.__file__ = f"HEAD:{PLANNER_PATH}"
    sys.modules[module.__name__] = module  # dataclasses look their module up while building the class
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def build_policy(eval_overrides: list[str] | None = None):
    """The CPU recipe's TD-MPC on pusht_keypoints with random weights (seed 0); returns (policy, cfg)."""
    cfg = compose_config(["+experiment=tdmpc_pusht_keypoints_cpu", *(eval_overrides or [])])
    torch.manual_seed(0)
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg))).eval()
    with torch.no_grad():
        policy.model.q_ensemble.weights[-1].normal_(0, 0.5)
        policy.model.reward_head[-1].weight.normal_(0, 0.5)
    return policy, cfg


class Planners:
    """The old (HEAD) and new planner for one policy; `use(name)` swaps one in."""

    def __init__(self, policy, head: types.ModuleType):
        self.policy = policy
        new = policy.planner
        seed = policy.config.planner_seed
        self.by_name = {
            "old": head.MPPIPlanner(head.PlannerSettings(**vars(new.s)), new.action_dim, seed=seed),
            "new": new_planner.MPPIPlanner(new.s, new.action_dim, seed=seed),
        }

    def use(self, name: str):
        """The policy acting with planner `name`, from a fresh state: default seeds, no previous plans."""
        self.policy.planner = self.by_name[name]
        self.policy.set_noise_seed(self.policy.config.planner_seed)
        self.policy.reset()
        return self.policy


def observations(batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Random pusht_keypoints observations in the env's bounds (0..512): (B, 16) and (B, 2)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.environment_state": torch.rand(batch_size, 16, generator=g) * 512,
        "observation.state": torch.rand(batch_size, 2, generator=g) * 512,
    }


def timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call `fn(*args)`."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def plan_rows(planners: Planners, threads: list[int], batch_sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for batch_size in batch_sizes:
            obs = observations(batch_size, seed=1)
            times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
            for name in times:  # warm-up: the first call allocates the per-env state
                planners.use(name).select_action(obs)
            for _ in range(repeats):
                for name in times:
                    policy = planners.use(name)
                    times[name].append(timed(policy.select_action, obs))
            old_wall = [t[0] for t in times["old"]]
            new_wall = [t[0] for t in times["new"]]
            row = {
                "row": "plan",
                "threads": n_threads,
                "batch": batch_size,
                "old_s": statistics.median(old_wall),
                "new_s": statistics.median(new_wall),
                "old_cpu_s": statistics.median(t[1] for t in times["old"]),
                "new_cpu_s": statistics.median(t[1] for t in times["new"]),
                "speedup": statistics.median(o / n for o, n in zip(old_wall, new_wall)),
                "old_runs_s": old_wall,
                "new_runs_s": new_wall,
            }
            rows.append(row)
            print(
                f"plan threads={n_threads} batch={batch_size}: old {row['old_s']:.3f}s new {row['new_s']:.3f}s"
                f" speedup {row['speedup']:.2f}x",
                flush=True,
            )
    return rows


def equality_rows(planners: Planners, batch_sizes: list[int]) -> list[dict]:
    """Old vs new actions from the same per-env seeds, 3 calls, env 0 reset before the last."""
    torch.set_num_threads(1)
    rows = []
    for batch_size in batch_sizes:
        actions = {}
        for name in ("old", "new"):
            policy = planners.use(name)
            policy.set_noise_seed([100 + b for b in range(batch_size)])
            out = []
            for call in range(3):
                if call == 2:
                    policy.reset([0])
                out.append(policy.select_action(observations(batch_size, seed=10 + call)))
            actions[name] = torch.stack(out)
        diff = (actions["old"] - actions["new"]).abs().max().item()
        rows.append(
            {
                "row": "equal",
                "batch": batch_size,
                "max_abs_diff": diff,
                "bit_identical": bool(torch.equal(actions["old"], actions["new"])),
            }
        )
    return rows


def eval_rows(head: types.ModuleType, n_episodes: int, n_envs: int = 10, steps: int = 50) -> list[dict]:
    """`eval_policy` with `n_envs` sync envs and `steps`-step episodes, old and new alternating twice."""
    torch.set_num_threads(1)
    policy, cfg = build_policy([f"env.max_episode_steps={steps}"])
    planners = Planners(policy, head)
    env_cfg = env_config(cfg)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    env = make_env(env_cfg, n_envs, use_async=False)
    try:
        for _ in range(2):
            for name in runs:
                info = eval_policy(env, planners.use(name), n_episodes, start_seed=0, progress=False)
                runs[name].append(info)
                print(f"eval {name}: {info['aggregated']['eval_s']:.1f}s", flush=True)
    finally:
        env.close()
    rewards = {name: [ep["sum_reward"] for ep in runs[name][0]["per_episode"]] for name in runs}
    old_s = statistics.median(r["aggregated"]["eval_s"] for r in runs["old"])
    new_s = statistics.median(r["aggregated"]["eval_s"] for r in runs["new"])
    return [
        {
            "row": "eval",
            "threads": 1,
            "n_envs": n_envs,
            "n_episodes": n_episodes,
            "max_episode_steps": steps,
            "old_s": old_s,
            "new_s": new_s,
            "speedup": old_s / new_s,
            "old_runs_s": [r["aggregated"]["eval_s"] for r in runs["old"]],
            "new_runs_s": [r["aggregated"]["eval_s"] for r in runs["new"]],
            "same_episode_rewards": rewards["old"] == rewards["new"],
        }
    ]


def sweep_rows(planners: Planners, repeats: int, sizes=(128, 256, 512, 1024, 2048, 10**9)) -> list[dict]:
    """New planner's time on one thread, batch 50, against `ROWS_PER_BLOCK` (10**9: a single block)."""
    torch.set_num_threads(1)
    obs = observations(50, seed=1)
    default = new_planner.ROWS_PER_BLOCK
    times: dict[int, list[float]] = {size: [] for size in sizes}
    policy = planners.use("new")
    try:
        for _ in range(repeats):
            for size in sizes:
                new_planner.ROWS_PER_BLOCK = size
                times[size].append(timed(policy.select_action, obs)[0])
    finally:
        new_planner.ROWS_PER_BLOCK = default
    return [
        {"row": "sweep", "rows_per_block": size, "new_s": statistics.median(times[size])} for size in sizes
    ]


def linears(net: nn.Sequential) -> list[nn.Linear]:
    return [layer for layer in net if isinstance(layer, nn.Linear)]


def floor_rows(policy, repeats: int, batch_size: int = 50) -> list[dict]:
    """The arithmetic left once every other op is free: one planning call's matmuls alone (same shapes and
    weights as the new planner's blocks, on one thread) and its ELUs' expm1 alone.

    old_s / (gemm_s + expm1_s) bounds the speedup any bit-identical planner can reach on this machine."""
    torch.set_num_threads(1)
    cfg, model = policy.config, policy.model
    n_rows = batch_size * (cfg.num_samples + cfg.num_pi_trajs)
    blocks = new_planner.block_bounds(n_rows, new_planner.ROWS_PER_BLOCK)
    r_max = max(stop - start for start, stop in blocks)
    q = model.q_ensemble
    za = torch.rand(r_max, cfg.latent_dim + policy.action_dim) * 2 - 1
    z = za[:, : cfg.latent_dim].contiguous()
    hidden = torch.randn(q.n, r_max, cfg.mlp_dim)
    dyn, rew, pi = linears(model.dynamics), linears(model.reward_head), linears(model.pi_head)

    def gemms() -> None:
        for _ in range(cfg.iterations):
            for start, stop in blocks:
                r = stop - start
                h = hidden[0, :r]
                for _t in range(cfg.planning_horizon):
                    for net in (dyn, rew):
                        F.linear(za[:r], net[0].weight, net[0].bias)
                        for layer in net[1:]:
                            F.linear(h, layer.weight, layer.bias)
                F.linear(z[:r], pi[0].weight, pi[0].bias)
                for layer in pi[1:]:
                    F.linear(h, layer.weight, layer.bias)
                torch.baddbmm(q.biases[0].unsqueeze(1), za[:r].unsqueeze(0).expand(q.n, -1, -1), q.weights[0])
                for w, b in zip(q.weights[1:], q.biases[1:]):
                    torch.baddbmm(b.unsqueeze(1), hidden[:, :r], w)

    def expm1s() -> None:
        for _ in range(cfg.iterations):
            for start, stop in blocks:
                r = stop - start
                for _call in range(4 * cfg.planning_horizon + 2):  # reward and dynamics, then pi
                    torch.expm1(hidden[0, :r])
                for _call in range(2):  # the Q ensemble's two hidden layers
                    torch.expm1(hidden[:, :r])

    macs_per_row = sum(
        layer.in_features * layer.out_features for layer in dyn + rew
    ) * cfg.planning_horizon + sum(layer.in_features * layer.out_features for layer in pi)
    macs_per_row += sum(w[0].numel() for w in q.weights) * q.n
    with torch.no_grad():
        gemms(), expm1s()  # warm-up
        gemm_s = statistics.median(timed(gemms)[0] for _ in range(repeats))
        expm1_s = statistics.median(timed(expm1s)[0] for _ in range(repeats))
    flop = 2 * macs_per_row * n_rows * cfg.iterations
    return [
        {
            "row": "floor",
            "threads": 1,
            "batch": batch_size,
            "gflop": flop / 1e9,
            "gemm_s": gemm_s,
            "gemm_gflop_per_s": flop / gemm_s / 1e9,
            "expm1_s": expm1_s,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[50, 8, 1])
    parser.add_argument("--eval-episodes", type=int, default=10, help="0 skips the eval rows")
    parser.add_argument("--sweep", action="store_true", help="also time ROWS_PER_BLOCK choices")
    args = parser.parse_args()

    machine_at_start = common.machine_info()
    head = load_head_planner()
    policy, _ = build_policy()
    planners = Planners(policy, head)
    rows = equality_rows(planners, args.batch_sizes)
    common.print_table(rows, ["row", "batch", "max_abs_diff", "bit_identical"])
    rows += plan_rows(planners, args.threads, args.batch_sizes, args.repeats)
    rows += floor_rows(policy, args.repeats)
    if args.sweep:
        rows += sweep_rows(planners, args.repeats)
    if args.eval_episodes > 0:
        rows += eval_rows(head, args.eval_episodes)
    common.print_table(
        rows,
        ["row", "threads", "batch", "rows_per_block", "old_s", "new_s", "speedup", "gemm_s", "expm1_s"],
    )
    cfg = policy.config
    path = common.save_results(
        "tdmpc_eval",
        rows,
        {
            "lscpu_model": lscpu_model(),
            "torch_version": torch.__version__,
            "planner": {
                k: getattr(cfg, k) for k in ("num_samples", "num_elites", "num_pi_trajs", "iterations")
            }
            | {"horizon": cfg.planning_horizon, "mlp_dim": cfg.mlp_dim, "latent_dim": cfg.latent_dim},
            "rows_per_block": new_planner.ROWS_PER_BLOCK,
            "machine_at_start": machine_at_start,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
