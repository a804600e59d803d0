"""The many-env trade-off of online TD-MPC on a DeepMind Control task: n_envs x updates per transition.

    python benchmarks/bench_tdmpc_tradeoff.py run     # every (n_envs, utd_ratio, seed) run, two at a time
    python benchmarks/bench_tdmpc_tradeoff.py plot    # redraw the PNG and print the table from the JSON

Each run trains TD-MPC (the CPU-sized model and planner of docs/tdmpc.md) on the same budget of env transitions
(all envs together), with `training.n_envs` envs stepped at once and `training.utd_ratio` gradient updates per
collected transition, and evaluates it every `--eval-freq` transitions on the same 10 seeded episodes. The
x axes: transitions (sample efficiency) and training wall time (evaluations excluded: `train_time_s`).

The task is cartpole-swingup with TD-MPC's own setting for cartpole (nicklashansen/tdmpc, cfgs/tasks/
cartpole.yaml: action repeat 8, so 125 agent steps per 1,000-step episode; the return is still summed over the
1,000 control steps, at most 1,000): the budget then reaches the part of the curve where the runs separate.

Runs go `--jobs` at a time, each in its own process on one thread (two side by side on a 2-core machine: every
wall time is measured under the same sharing). Results go to `benchmarks/results/tdmpc_tradeoff.json` (one
entry per run, written as each finishes, so an interrupted study resumes with the missing runs) and
`tdmpc_tradeoff.png`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import time
from pathlib import Path

import common  # first: it sets OMP_WAIT_POLICY before torch loads
from bench_online import CPU_OVERRIDES, _read_metrics

REPO = Path(__file__).resolve().parents[1]
RESULTS_FILE = REPO / "benchmarks" / "results" / "tdmpc_tradeoff.json"
PLOT_FILE = REPO / "benchmarks" / "results" / "tdmpc_tradeoff.png"

# TD-MPC's cartpole protocol (action repeat 8: 125 agent steps per episode).
ENV_OVERRIDES = [
    "env=dmc_cartpole_swingup",
    "env.gym_kwargs.action_repeat=8",
    "env.max_episode_steps=125",
    "env.fps=12",
]


def _key(n_envs: int, utd: float, seed: int) -> str:
    return f"n{n_envs}_utd{utd:g}_s{seed}"


def _train_one(job: dict) -> dict:
    """One training run in this (worker) process, on one thread; returns its curves and wall time."""
    import torch

    from lerobot.cli import compose_config
    from lerobot.config import env_config
    from lerobot.policy_registry import make_policy_config
    from lerobot.training.online import train_online

    torch.set_num_threads(1)
    run_dir = Path(job["run_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = compose_config(job["overrides"] + [f"output_dir={run_dir}"])
    t0 = time.perf_counter()
    train_online(cfg, make_policy_config(cfg.policy, env_config(cfg)), progress=False)
    return {
        "n_envs": job["n_envs"],
        "utd_ratio": job["utd"],
        "seed": job["seed"],
        "wall_s": time.perf_counter() - t0,
        **_read_metrics(run_dir),
    }


def run(args: argparse.Namespace) -> None:
    """Train the missing runs of the grid, `--jobs` at a time, saving each result as it comes."""
    results = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {"runs": {}}
    results["settings"] = {
        "machine": common.machine_info(),
        "jobs": args.jobs,
        "threads_per_run": 1,
        "steps": args.steps,
        "learning_starts": args.learning_starts,
        "eval_freq": args.eval_freq,
        "eval_episodes": args.eval_episodes,
        "overrides": ["policy=tdmpc", *ENV_OVERRIDES, *CPU_OVERRIDES],
    }
    jobs = []
    for seed in args.seeds:
        for n_envs in args.n_envs:
            for utd in args.utd_ratios:
                key = _key(n_envs, utd, seed)
                if key in results["runs"]:
                    continue
                overrides = [
                    "policy=tdmpc",
                    *ENV_OVERRIDES,
                    *CPU_OVERRIDES,
                    f"training.steps={args.steps}",
                    f"training.n_envs={n_envs}",
                    f"training.utd_ratio={utd}",
                    f"training.learning_starts={args.learning_starts}",
                    f"training.log_freq={args.eval_freq}",
                    f"training.save_freq={10 * args.steps}",
                    "training.save_buffer=false",
                    f"eval.freq={args.eval_freq}",
                    f"eval.n_episodes={args.eval_episodes}",
                    f"eval.batch_size={args.eval_episodes}",
                    "eval.max_episodes_rendered=0",
                    "eval.use_async_envs=false",
                    f"seed={seed}",
                ]
                # Costliest first (updates dominate, fewer envs plan more often), so the lanes end together.
                cost = utd + 0.3 / n_envs
                run_dir = str(Path(args.work_dir) / key)
                jobs.append(
                    (
                        cost,
                        {
                            "key": key,
                            "n_envs": n_envs,
                            "utd": utd,
                            "seed": seed,
                            "run_dir": run_dir,
                            "overrides": overrides,
                        },
                    )
                )
    jobs = [job for _, job in sorted(jobs, key=lambda j: -j[0])]
    print(f"{len(jobs)} runs to train, {args.jobs} at a time", flush=True)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs, maxtasksperchild=1) as pool:
        for job, result in zip(jobs, pool.imap(_train_one, jobs)):
            results["runs"][job["key"]] = result
            RESULTS_FILE.write_text(json.dumps(results, indent=1))
            last = result["eval"][-1]
            print(
                f"{job['key']}: return {last['eval_return']:.1f}, train time {last['train_time_s']:.0f} s",
                flush=True,
            )
    plot(args)


def _mean_curves(runs: list[dict]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per eval point over seeds: transitions, mean train time (s), mean and std of the eval return."""
    n_points = min(len(r["eval"]) for r in runs)
    xs = [runs[0]["eval"][i]["transitions"] for i in range(n_points)]
    ts = [statistics.mean(r["eval"][i]["train_time_s"] for r in runs) for i in range(n_points)]
    ys = [[r["eval"][i]["eval_return"] for r in runs] for i in range(n_points)]
    means = [statistics.mean(y) for y in ys]
    stds = [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]
    return xs, ts, means, stds


def _grouped() -> dict[tuple[int, float], list[dict]]:
    results = json.loads(RESULTS_FILE.read_text())
    groups: dict[tuple[int, float], list[dict]] = {}
    for run in results["runs"].values():
        groups.setdefault((run["n_envs"], run["utd_ratio"]), []).append(run)
    return dict(sorted(groups.items()))


# The return the table times each setting to (its seeds' mean curve reaching it first).
TARGET_RETURN = 700


def table() -> str:
    """Markdown table: per (n_envs, utd), the seeds' mean (± std) return at half and all of the budget,
    transitions and training minutes until the mean curve first reaches `TARGET_RETURN`, total training time."""
    lines = [
        "| n_envs | updates per transition | updates | seeds | return at half the budget | final return | "
        f"first mean eval >= {TARGET_RETURN}: transitions / min | training time (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (n_envs, utd), runs in _grouped().items():
        xs, ts, means, stds = _mean_curves(runs)
        half = min(range(len(xs)), key=lambda i: abs(xs[i] - xs[-1] / 2))
        reached = next((i for i, m in enumerate(means) if m >= TARGET_RETURN), None)
        when = f"{xs[reached]} / {ts[reached] / 60:.1f}" if reached is not None else "not reached"
        updates = statistics.mean(r["eval"][-1]["updates"] for r in runs)
        lines.append(
            f"| {n_envs} | {utd:g} | {updates:.0f} | {len(runs)} | {means[half]:.0f} ± {stds[half]:.0f} | "
            f"{means[-1]:.0f} ± {stds[-1]:.0f} | {when} | {ts[-1] / 60:.1f} |"
        )
    return "\n".join(lines)


def plot(args: argparse.Namespace | None = None) -> None:
    """Mean eval return over seeds (band: one std) against transitions and against training wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    colors: dict[int, str] = {}
    for (n_envs, utd), runs in _grouped().items():
        xs, ts, means, stds = _mean_curves(runs)
        low = [m - s for m, s in zip(means, stds)]
        high = [m + s for m, s in zip(means, stds)]
        # Colour: the env count; line style: the update ratio.
        color, style = colors.setdefault(n_envs, f"C{len(colors)}"), "-" if utd == 1 else "--"
        label = f"n_envs={n_envs}, {utd:g} updates/transition ({len(runs)} seeds)"
        for ax, x in ((axes[0], xs), (axes[1], [t / 60 for t in ts])):
            ax.plot(x, means, style, color=color, marker="o", markersize=3, label=label)
            ax.fill_between(x, low, high, color=color, alpha=0.1)
    axes[0].set_xlabel("env transitions, all envs (agent steps at action repeat 8)")
    axes[1].set_xlabel("training wall time (min; evaluations excluded)")
    for ax in axes:
        ax.set_ylabel("eval return, 10 episodes")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "TD-MPC (CPU-sized) on DMC cartpole-swingup, action repeat 8: envs stepped at once x updates per "
        "transition; mean and std over seeds, 2 runs side by side on 1 thread each",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(PLOT_FILE, dpi=90)
    print(table())
    print(f"wrote {PLOT_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--steps", type=int, default=10000, help="env transitions per run, all envs together")
    r.add_argument("--learning-starts", type=int, default=1000)
    r.add_argument("--eval-freq", type=int, default=1000)
    r.add_argument("--eval-episodes", type=int, default=10)
    r.add_argument("--n-envs", type=int, nargs="+", default=[1, 4, 8])
    r.add_argument("--utd-ratios", type=float, nargs="+", default=[1.0, 0.25])
    r.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--work-dir", default="outputs/bench/tdmpc_tradeoff")
    sub.add_parser("plot")
    args = parser.parse_args()
    {"run": run, "plot": plot}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
