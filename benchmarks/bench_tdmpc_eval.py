"""TD-MPC acting speed: the code of a git ref (the baseline) against the working tree's, in one run.

    python benchmarks/bench_tdmpc_eval.py [--baseline REF] [--repeats 5] [--threads 1 2]
                                          [--batch-sizes 50 8 1] [--eval-episodes 50] [--eval-envs 50]
                                          [--sweep] [--results tdmpc_eval]

The policy is the CPU recipe (configs/experiment/tdmpc_pusht_keypoints_cpu.yaml: 128 samples, 16 elites,
8 policy trajectories, 3 iterations, horizon 5, 256-wide MLPs) on pusht_keypoints, with random weights
(seed 0; the zero-initialised reward and Q output layers get random weights too, so that candidate values
differ and the elite selection is exercised). The baseline is the whole `lerobot/` and `configs/` of
`--baseline` (default HEAD; `de06294` is the code before any TD-MPC evaluation speed work), extracted with
`git archive` into a temporary directory: each measurement runs in a worker process that imports either that
tree or the working tree, old and new alternating, so a load change on this shared machine hits both. A
worker sets what the tree's commands set for their process (`lerobot.runtime.allocator`, where the tree has
it; `allocator_set` in the rows says which did).

Rows:
- `plan`: `select_action` (one planning call, n_action_steps=1) on batches of 50, 8 and 1 observations, for
  each torch thread count; medians of `--repeats` worker pairs; `speedup` is the median of the per-repeat
  old/new ratios.
- `equal`: both trees from the same per-env seeds for 3 calls, with env 0 reset before the third;
  `max_abs_diff` over the actions (env units), whether they are bit-identical, and the share of actions
  within 1e-3 of each other (a rounding difference can flip which elite a plan draws).
- `eval`: `eval_policy` (the loop of scripts/eval.py) with `--eval-envs` sync envs on `--eval-episodes`
  episodes of 50 steps, old then new, twice, one thread; per-episode rewards compared.
- `floor`: one planning call (batch 50, one thread) reduced to its matmuls alone, and to its ELUs alone
  (the working tree's), every candidate evaluated in every iteration: the arithmetic of the old planner's
  computation.
- `sweep` (with --sweep): the working tree's planner time against `ROWS_PER_BLOCK` on one thread, batch 50.

Writes benchmarks/results/<--results>.json (with `lscpu`'s CPU model and the torch version).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import common  # first: it sets OMP_WAIT_POLICY before torch loads
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
RECIPE = "+experiment=tdmpc_pusht_keypoints_cpu"
EVAL_STEPS = 50


# ------------------------------------------------------------------ worker side: runs in either tree
def build_policy(overrides: list[str] | None = None):
    """The CPU recipe's TD-MPC on pusht_keypoints with random weights (seed 0), from whichever `lerobot` is
    imported; returns (policy, cfg)."""
    import lerobot
    from lerobot.config import env_config

    try:
        from lerobot.cli import compose_config
    except ImportError:  # a tree whose CLI package does not import whole (de06294): its compose module alone
        cli = types.ModuleType("lerobot.cli")
        cli.__path__ = [str(Path(lerobot.__file__).parent / "cli")]
        sys.modules["lerobot.cli"] = cli
        from lerobot.cli.compose import compose_config
    try:
        from lerobot.policy_registry import make_policy, make_policy_config
    except ImportError:  # trees before the registry moved out of lerobot.policies
        from lerobot.policies.factory import make_policy, make_policy_config

    cfg = compose_config([RECIPE, *(overrides or [])])
    torch.manual_seed(0)
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg))).eval()
    with torch.no_grad():
        policy.model.q_ensemble.weights[-1].normal_(0, 0.5)
        policy.model.reward_head[-1].weight.normal_(0, 0.5)
    return policy, cfg


def fresh(policy):
    """The policy from a fresh state: default seeds, no previous plans."""
    policy.set_noise_seed(policy.config.planner_seed)
    policy.reset()
    return policy


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


def worker_plan(threads: list[int], batch_sizes: list[int]) -> dict:
    """One timed planning call per (threads, batch) after a warm-up, and the equality protocol's actions."""
    policy, _ = build_policy()
    times = {}
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for batch_size in batch_sizes:
            obs = observations(batch_size, seed=1)
            fresh(policy).select_action(obs)  # warm-up: the first call allocates the per-env state
            times[f"{n_threads}/{batch_size}"] = timed(fresh(policy).select_action, obs)
    torch.set_num_threads(1)
    actions = {}
    for batch_size in batch_sizes:
        policy.set_noise_seed([100 + b for b in range(batch_size)])
        policy.reset()
        out = []
        for call in range(3):
            if call == 2:
                policy.reset([0])
            out.append(policy.select_action(observations(batch_size, seed=10 + call)))
        actions[str(batch_size)] = torch.stack(out).tolist()
    return {"times": times, "actions": actions}


def worker_eval(n_envs: int, n_episodes: int) -> dict:
    """`eval_policy` on `n_episodes` episodes of EVAL_STEPS steps with `n_envs` sync envs, one thread."""
    from lerobot.config import env_config
    from lerobot.envs import make_env
    from lerobot.rollout import eval_policy

    torch.set_num_threads(1)
    policy, cfg = build_policy([f"env.max_episode_steps={EVAL_STEPS}"])
    env = make_env(env_config(cfg), n_envs, use_async=False)
    try:
        info = eval_policy(env, fresh(policy), n_episodes, start_seed=0, progress=False)
    finally:
        env.close()
    return {
        "eval_s": info["aggregated"]["eval_s"],
        "rewards": [ep["sum_reward"] for ep in info["per_episode"]],
    }


# ------------------------------------------------------------------ parent side
def extract(ref: str, into: Path) -> Path:
    """`lerobot/` and `configs/` of git `ref` written under `into`; returns `into`."""
    archive = subprocess.run(
        ["git", "archive", ref, "lerobot", "configs"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_worker(tree: Path, task: str, **kwargs) -> dict:
    """Run `task` (worker_plan / worker_eval with `kwargs`) in a process that imports `lerobot` from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        task,
        "--worker-args",
        json.dumps(kwargs),
    ]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"worker {task} in {tree} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["lerobot"]).resolve().parents[1] != tree.resolve():
        raise RuntimeError(f"worker imported lerobot from {result['lerobot']}, not from {tree}")
    return result


def plan_and_equal_rows(trees: dict[str, Path], threads, batch_sizes, repeats) -> list[dict]:
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(repeats):
        for name, tree in trees.items():
            runs[name].append(run_worker(tree, "plan", threads=threads, batch_sizes=batch_sizes))
    rows = []
    for batch_size in batch_sizes:
        old = torch.tensor(runs["old"][0]["actions"][str(batch_size)])
        new = torch.tensor(runs["new"][0]["actions"][str(batch_size)])
        close = (old - new).abs().amax(dim=-1) <= 1e-3
        rows.append(
            {
                "row": "equal",
                "batch": batch_size,
                "max_abs_diff": (old - new).abs().max().item(),
                "bit_identical": bool(torch.equal(old, new)),
                "share_within_1e-3": close.float().mean().item(),
            }
        )
    for key in runs["old"][0]["times"]:
        n_threads, batch_size = (int(v) for v in key.split("/"))
        old = [r["times"][key] for r in runs["old"]]
        new = [r["times"][key] for r in runs["new"]]
        row = {
            "row": "plan",
            "threads": n_threads,
            "batch": batch_size,
            "old_s": statistics.median(t[0] for t in old),
            "new_s": statistics.median(t[0] for t in new),
            "old_cpu_s": statistics.median(t[1] for t in old),
            "new_cpu_s": statistics.median(t[1] for t in new),
            "speedup": statistics.median(o[0] / n[0] for o, n in zip(old, new)),
            "old_runs_s": [t[0] for t in old],
            "new_runs_s": [t[0] for t in new],
            "allocator_set": {name: runs[name][0]["allocator_set"] for name in runs},
        }
        rows.append(row)
        print(
            f"plan threads={n_threads} batch={batch_size}: old {row['old_s']:.3f}s new {row['new_s']:.3f}s"
            f" speedup {row['speedup']:.2f}x",
            flush=True,
        )
    return rows


def eval_rows(trees: dict[str, Path], n_envs: int, n_episodes: int) -> list[dict]:
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(2):
        for name, tree in trees.items():
            runs[name].append(run_worker(tree, "eval", n_envs=n_envs, n_episodes=n_episodes))
            print(f"eval {name}: {runs[name][-1]['eval_s']:.1f}s", flush=True)
    old_s = statistics.median(r["eval_s"] for r in runs["old"])
    new_s = statistics.median(r["eval_s"] for r in runs["new"])
    old_r, new_r = runs["old"][0]["rewards"], runs["new"][0]["rewards"]
    return [
        {
            "row": "eval",
            "threads": 1,
            "n_envs": n_envs,
            "n_episodes": n_episodes,
            "max_episode_steps": EVAL_STEPS,
            "old_s": old_s,
            "new_s": new_s,
            "speedup": old_s / new_s,
            "old_runs_s": [r["eval_s"] for r in runs["old"]],
            "new_runs_s": [r["eval_s"] for r in runs["new"]],
            "same_episode_rewards": old_r == new_r,
            "old_mean_sum_reward": statistics.mean(old_r),
            "new_mean_sum_reward": statistics.mean(new_r),
        }
    ]


def sweep_rows(repeats: int, sizes=(128, 256, 512, 1024, 2048, 10**9)) -> list[dict]:
    """The working tree's planner time on one thread, batch 50, against `ROWS_PER_BLOCK` (10**9: one block)."""
    from lerobot.policies.tdmpc import planner

    torch.set_num_threads(1)
    obs = observations(50, seed=1)
    default = planner.ROWS_PER_BLOCK
    times: dict[int, list[float]] = {size: [] for size in sizes}
    policy, _ = build_policy()
    try:
        for _ in range(repeats):
            for size in sizes:
                planner.ROWS_PER_BLOCK = size
                times[size].append(timed(fresh(policy).select_action, obs)[0])
    finally:
        planner.ROWS_PER_BLOCK = default
    return [
        {"row": "sweep", "rows_per_block": size, "new_s": statistics.median(times[size])} for size in sizes
    ]


def linears(net: nn.Sequential) -> list[nn.Linear]:
    return [layer for layer in net if isinstance(layer, nn.Linear)]


def floor_rows(repeats: int, batch_size: int = 50) -> list[dict]:
    """The arithmetic left once every other op is free: one planning call's matmuls alone (same shapes and
    weights as the working tree's blocks, on one thread) and its ELUs alone."""
    from lerobot.policies.tdmpc import planner
    from lerobot.policies.tdmpc.networks import elu_, member_linear

    torch.set_num_threads(1)
    policy, _ = build_policy()
    cfg, model = policy.config, policy.model
    n_rows = batch_size * (cfg.num_samples + cfg.num_pi_trajs)
    blocks = planner.block_bounds(n_rows, planner.ROWS_PER_BLOCK)
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
                member_linear(za[:r].unsqueeze(0).expand(q.n, -1, -1), q.weights[0], q.biases[0])
                for w, b in zip(q.weights[1:], q.biases[1:]):
                    member_linear(hidden[:, :r], w, b)

    def elus() -> None:
        for _ in range(cfg.iterations):
            for start, stop in blocks:
                r = stop - start
                for _call in range(4 * cfg.planning_horizon + 2):  # reward and dynamics, then pi
                    elu_(hidden[0, :r].clone())
                for _call in range(2):  # the Q ensemble's two hidden layers
                    elu_(hidden[:, :r].clone())

    macs_per_row = sum(
        layer.in_features * layer.out_features for layer in dyn + rew
    ) * cfg.planning_horizon + sum(layer.in_features * layer.out_features for layer in pi)
    macs_per_row += sum(w[0].numel() for w in q.weights) * q.n
    with torch.no_grad():
        gemms(), elus()  # warm-up
        gemm_s = statistics.median(timed(gemms)[0] for _ in range(repeats))
        elu_s = statistics.median(timed(elus)[0] for _ in range(repeats))
    flop = 2 * macs_per_row * n_rows * cfg.iterations
    return [
        {
            "row": "floor",
            "threads": 1,
            "batch": batch_size,
            "gflop": flop / 1e9,
            "gemm_s": gemm_s,
            "gemm_gflop_per_s": flop / gemm_s / 1e9,
            "elu_s": elu_s,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git ref whose code is the baseline ('old')")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[50, 8, 1])
    parser.add_argument("--eval-episodes", type=int, default=50, help="0 skips the eval rows")
    parser.add_argument("--eval-envs", type=int, default=50)
    parser.add_argument("--sweep", action="store_true", help="also time ROWS_PER_BLOCK choices")
    parser.add_argument("--results", default="tdmpc_eval", help="results/<name>.json to write")
    parser.add_argument("--worker", choices=["plan", "eval"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()

    # What the tree's commands set for their process (lerobot.cli.exit.run_command), where it has it.
    try:
        from lerobot.runtime.allocator import keep_freed_memory
    except ImportError:  # trees before the allocator setting
        allocator_set = False
    else:
        allocator_set = keep_freed_memory()

    if args.worker:
        import lerobot

        task = worker_plan if args.worker == "plan" else worker_eval
        result = task(**json.loads(args.worker_args))
        print(json.dumps({**result, "lerobot": lerobot.__file__, "allocator_set": allocator_set}))
        return

    from lerobot.policies.tdmpc import planner

    machine_at_start = common.machine_info()
    baseline_commit = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tdmpc_baseline_") as tmp:
        trees = {"old": extract(args.baseline, Path(tmp)), "new": REPO}
        rows = plan_and_equal_rows(trees, args.threads, args.batch_sizes, args.repeats)
        common.print_table(rows, ["row", "batch", "max_abs_diff", "bit_identical", "share_within_1e-3"])
        rows += floor_rows(args.repeats)
        if args.sweep:
            rows += sweep_rows(args.repeats)
        if args.eval_episodes > 0:
            rows += eval_rows(trees, args.eval_envs, args.eval_episodes)
    common.print_table(
        rows, ["row", "threads", "batch", "rows_per_block", "old_s", "new_s", "speedup", "gemm_s", "elu_s"]
    )
    policy, _ = build_policy()
    cfg = policy.config
    path = common.save_results(
        args.results,
        rows,
        {
            "baseline": {"ref": args.baseline, "commit": baseline_commit},
            "torch_version": torch.__version__,
            "planner": {
                k: getattr(cfg, k) for k in ("num_samples", "num_elites", "num_pi_trajs", "iterations")
            }
            | {"horizon": cfg.planning_horizon, "mlp_dim": cfg.mlp_dim, "latent_dim": cfg.latent_dim},
            "rows_per_block": planner.ROWS_PER_BLOCK,
            "machine_at_start": machine_at_start,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
