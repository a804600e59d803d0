"""TD-MPC and SAC against their published 100k-step figures: DeepMind Control and MetaWorld runs, queued and
resumable.

    python scripts/reproduce.py run --jobs 2                 # TD-MPC's queue, two runs at a time, one thread each
    python scripts/reproduce.py report                       # table and curves from whatever has been trained
    python scripts/reproduce.py run --policy sac --jobs 2    # SAC's queue: six DMC tasks
    python scripts/reproduce.py run --policy sac_pixels      # SAC from pixels against DrQ: two DMC tasks

Every run is `scripts/train.py` with a recipe writing to `--root/<size>/<run>` (`--root` defaults to
`outputs/<policy>_reproduce`): for TD-MPC the CPU-sized `tdmpc_dmc_cpu` / `tdmpc_metaworld_cpu` by default,
`--size paper` for `tdmpc_dmc` / `tdmpc_metaworld`; for SAC `sac_dmc_cpu` / `sac_dmc` (the same recipe: SAC's
networks need no CPU size). A run that is stopped (the session ends, the machine restarts) is resumed from its
last checkpoint and saved replay buffer by running `run` again: `training.resume=auto` continues any run
directory that holds a checkpoint. The training evaluations (10 episodes every 10,000 agent steps, fixed
seeds) are the curve; the figure at 100,000 steps is compared with the published one, the mean of 3 seeds in
nicklashansen/tdmpc2's `results/`:

- TD-MPC, DMC: the episode return in `results/tdmpc/<task>.csv` (commit e9f5932; docs/tdmpc.md lists the
  seeds); MetaWorld: the success in `results/tdmpc/mw-<task>.csv`, TD-MPC2's (`results/tdmpc2/mw-<task>.csv`)
  beside it;
- SAC, DMC: the episode return in `results/sac/<task>.csv` (commits add30b5 and 88095e7; docs/sac.md lists
  the seeds), TD-MPC2's published SAC baseline;
- SAC from pixels (`sac_dmc_pixels_cpu` / `sac_dmc_pixels`), DMC: DrQ's return in denisyarats/drq's
  `data/dmc_planet_bench.csv` (10 seeds). DrQ counts simulator steps, so its 100,000 are 100,000 / action
  repeat agent steps (cartpole-swingup 12,500, cup-catch 25,000); curves are drawn against simulator steps.

`--set KEY=VALUE ...` with `--tag NAME` trains the same runs with more overrides (e.g. `--set
training.per_alpha=0.6 --tag per`: TD-MPC's prioritised replay) under `--root/<size>-<tag>/`, and `report`
with the same `--tag` writes its own files, so a variant never mixes with the recipes' runs.

`report` writes `benchmarks/results/<policy>_reproduce.json`, `<policy>_reproduce.png` (against agent steps)
and `<policy>_reproduce_hours.png` (against training hours).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
STEPS = 100_000
RETURN, SUCCESS = "avg_sum_reward", "pc_success"


@dataclass(frozen=True)
class Task:
    """One task of a reproduction and its published figures."""

    suite: str  # "dmc" or "metaworld": picks the recipe
    overrides: tuple[str, ...]  # what picks the task
    # The published curve's points up to 100k agent steps, (step, mean over its 3 seeds); the CSVs hold steps
    # 0 and 100000 in that range.
    published: tuple[tuple[int, float], ...]
    # The lowest and highest of the published seeds at 100k: a figure inside counts as a match whatever its
    # distance to the mean.
    spread: tuple[float, float]
    metric: str = RETURN
    beside: tuple[str, float] | None = None  # another method's figure at 100k, shown beside the published one
    # The published curve's steps per agent step: 1 where it counts agent steps (TD-MPC2's CSVs), the action
    # repeat where it counts simulator steps (DrQ's). The runs train 100k of the published steps.
    step_scale: int = 1

    @property
    def agent_steps(self) -> int:
        """The run's length in agent steps: the published budget of 100,000 steps in its own unit."""
        return STEPS // self.step_scale


@dataclass(frozen=True)
class Reproduction:
    """A policy's published 100k figures and the recipes that train it."""

    title: str
    recipes: dict[tuple[str, str], str]  # (suite, size) -> the recipe
    tasks: dict[str, Task]


def _dmc(task: str) -> tuple[str, ...]:
    return (f"env=dmc_{task}",)


def _mw(task: str) -> tuple[str, ...]:
    return (f"env.task={task}-v3",)


REPRODUCTIONS = {
    "tdmpc": Reproduction(
        title="TD-MPC",
        recipes={
            ("dmc", "cpu"): "tdmpc_dmc_cpu",
            ("dmc", "paper"): "tdmpc_dmc",
            ("metaworld", "cpu"): "tdmpc_metaworld_cpu",
            ("metaworld", "paper"): "tdmpc_metaworld",
        },
        tasks={
            "cartpole_swingup": Task(
                "dmc", _dmc("cartpole_swingup"), ((0, 39.0), (STEPS, 863.1)), (850.7, 877.5)
            ),
            "walker_walk": Task("dmc", _dmc("walker_walk"), ((0, 33.9), (STEPS, 963.5)), (956.4, 971.1)),
            "reacher_easy": Task("dmc", _dmc("reacher_easy"), ((0, 61.8), (STEPS, 832.2)), (734.1, 934.0)),
            "finger_spin": Task("dmc", _dmc("finger_spin"), ((0, 0.8), (STEPS, 880.4)), (742.0, 969.3)),
            "mw_drawer_open": Task(
                "metaworld",
                _mw("drawer-open"),
                ((0, 0.0), (STEPS, 96.7)),
                (90.0, 100.0),
                SUCCESS,
                ("TD-MPC2", 100.0),
            ),
            "mw_hammer": Task(
                "metaworld",
                _mw("hammer"),
                ((0, 0.0), (STEPS, 96.7)),
                (90.0, 100.0),
                SUCCESS,
                ("TD-MPC2", 90.0),
            ),
            "mw_push": Task(
                "metaworld", _mw("push"), ((0, 0.0), (STEPS, 53.3)), (20.0, 80.0), SUCCESS, ("TD-MPC2", 63.3)
            ),
        },
    ),
    "sac": Reproduction(
        title="SAC",
        recipes={("dmc", "cpu"): "sac_dmc_cpu", ("dmc", "paper"): "sac_dmc"},
        tasks={
            "cartpole_swingup": Task(
                "dmc", _dmc("cartpole_swingup"), ((0, 3.4), (STEPS, 835.0)), (825.8, 844.8)
            ),
            "walker_walk": Task("dmc", _dmc("walker_walk"), ((0, 20.7), (STEPS, 708.2)), (509.6, 917.8)),
            "reacher_easy": Task("dmc", _dmc("reacher_easy"), ((0, 28.7), (STEPS, 540.4)), (68.4, 813.4)),
            "finger_spin": Task("dmc", _dmc("finger_spin"), ((0, 0.0), (STEPS, 762.4)), (743.5, 774.1)),
            "cup_catch": Task("dmc", _dmc("cup_catch"), ((0, 33.1), (STEPS, 958.1)), (949.2, 970.1)),
            "cheetah_run": Task("dmc", _dmc("cheetah_run"), ((0, 0.1), (STEPS, 310.1)), (236.9, 362.4)),
        },
    ),
    # DrQ's published curves (denisyarats/drq, data/dmc_planet_bench.csv at commit dd040f1, 10 seeds): the
    # mean return per evaluation against simulator steps, up to its last evaluation before 100,000 (96,000:
    # the paper's "100k step scores", 759 and 914), and the seeds' range there.
    "sac_pixels": Reproduction(
        title="SAC from pixels against DrQ",
        recipes={("dmc", "cpu"): "sac_dmc_pixels_cpu", ("dmc", "paper"): "sac_dmc_pixels"},
        tasks={
            "cartpole_swingup": Task(
                "dmc",
                ("env=dmc_cartpole_swingup_pixels",),  # action repeat 8: the recipe's 12,500 agent steps
                ((0, 17.8), (16000, 182.0), (32000, 274.4), (48000, 359.9), (64000, 450.4), (80000, 660.5))
                + ((96000, 759.4),),
                (572.0, 850.5),
                step_scale=8,
            ),
            "cup_catch": Task(
                "dmc",
                (
                    "env=dmc_cup_catch_pixels",
                    "training.steps=25000",
                    "eval.freq=2500",
                    "training.save_freq=2500",
                ),
                ((0, 48.6), (8000, 78.4), (16000, 141.9), (24000, 204.7), (32000, 390.6), (40000, 528.0))
                + ((48000, 655.7), (56000, 680.3), (64000, 789.3), (72000, 888.6), (80000, 876.3))
                + ((88000, 875.5), (96000, 913.8)),
                (780.0, 961.7),
                step_scale=4,
            ),
        },
    ),
}


def _run_dir(args: argparse.Namespace, name: str, seed: int) -> Path:
    root = Path(args.root or f"outputs/{args.policy}_reproduce")
    return root / (f"{args.size}-{args.tag}" if args.tag else args.size) / f"{name}_s{seed}"


def _outputs(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """The report's files: results JSON, curves against steps and against hours (with the variant's tag)."""
    tag = f"_{args.tag}" if args.tag else ""
    return (
        RESULTS_DIR / f"{args.policy}_reproduce{tag}.json",
        RESULTS_DIR / f"{args.policy}_reproduce{tag}.png",
        RESULTS_DIR / f"{args.policy}_reproduce_hours{tag}.png",
    )


def _evals(run_dir: Path) -> list[dict]:
    """The run's evaluation records (agent steps and metrics), oldest first; none when it has not started."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    hours = {r["step"]: r["train_time_s"] / 3600 for r in records if r["split"] == "train"}
    evals = {r["step"]: r for r in records if r["split"] == "eval"}  # a resumed run may repeat one
    return [{**evals[s], "train_hours": hours.get(s)} for s in sorted(evals)]


def _finished(run_dir: Path, task: Task) -> bool:
    return any(r["step"] >= task.agent_steps for r in _evals(run_dir))


def _command(args: argparse.Namespace, name: str, seed: int) -> list[str]:
    reproduction = REPRODUCTIONS[args.policy]
    task = reproduction.tasks[name]
    return [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        f"+experiment={reproduction.recipes[task.suite, args.size]}",
        *task.overrides,
        f"seed={seed}",
        *args.set,
        f"output_dir={_run_dir(args, name, seed)}",
    ]


def run(args: argparse.Namespace) -> None:
    """Train (or resume) every run of the queue not yet at 100,000 steps, `--jobs` at a time."""
    tasks = REPRODUCTIONS[args.policy].tasks
    queue = [(n, s) for s in args.seeds for n in args.runs if not _finished(_run_dir(args, n, s), tasks[n])]
    print(f"{len(queue)} runs to train or resume, {args.jobs} at a time, one thread each", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    running: list[tuple[str, subprocess.Popen]] = []
    while queue or running:
        while queue and len(running) < args.jobs:
            name, seed = queue.pop(0)
            run_dir = _run_dir(args, name, seed)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.parent / f"{run_dir.name}.log", "a")  # noqa: SIM115 (closed with the process)
            proc = subprocess.Popen(_command(args, name, seed), stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((f"{name}_s{seed}", proc))
            print(f"started {name} seed {seed} (pid {proc.pid})", flush=True)
        finished = [(key, p) for key, p in running if p.poll() is not None]
        if not finished:
            time.sleep(10)
            continue
        for key, p in finished:
            running.remove((key, p))
            print(f"{key}: exit {p.returncode}", flush=True)
    report(args)


def _seeds_on_disk(args: argparse.Namespace, name: str) -> list[int]:
    """The seeds of the task's run directories under the root, whichever `run` made them."""
    found = _run_dir(args, name, 0).parent.glob(f"{name}_s*")
    suffixes = (d.name.removeprefix(f"{name}_s") for d in found if d.is_dir())
    return sorted(int(seed) for seed in suffixes if seed.isdigit())


def _curves(args: argparse.Namespace) -> dict:
    """Every run's evaluations under the root, all tasks and seeds (a queue of a few runs still reports them
    all): {run key: {suite, metric, published, curve: [{step, train_hours, metric}]}}."""
    runs: dict = {}
    for name, task in REPRODUCTIONS[args.policy].tasks.items():
        for seed in _seeds_on_disk(args, name):
            evals = _evals(_run_dir(args, name, seed))
            if evals:
                runs[f"{name}_s{seed}"] = {
                    "task": name,
                    "seed": seed,
                    "suite": task.suite,
                    "metric": task.metric,
                    "published": task.published[-1][1],
                    "step_scale": task.step_scale,
                    "curve": [
                        {"step": r["step"], "train_hours": r["train_hours"], task.metric: r[task.metric]}
                        for r in evals
                    ],
                }
    return runs


def _plot(args: argparse.Namespace, runs: dict, against_hours: bool, path: Path) -> None:
    """One panel per task, a row per suite (DMC returns 0-1000, MetaWorld success %), against agent steps (with
    the published CSV points) or training hours (with the published figure at 100k as a line to reach)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reproduction = REPRODUCTIONS[args.policy]
    suites = {
        suite: [n for n, t in reproduction.tasks.items() if t.suite == suite]
        for suite in ("dmc", "metaworld")
    }
    suites = {suite: names for suite, names in suites.items() if names}
    n_cols = max(len(names) for names in suites.values())
    fig, axes = plt.subplots(
        len(suites), n_cols, figsize=(3.2 * n_cols, 2.8 * len(suites) + 0.3), squeeze=False
    )
    for row, (suite, names) in enumerate(suites.items()):
        for col in range(len(names), n_cols):
            axes[row][col].axis("off")
        for ax, name in zip(axes[row], names):
            points, metric = reproduction.tasks[name].published, reproduction.tasks[name].metric
            for run in (r for r in runs.values() if r["task"] == name):
                curve = [c for c in run["curve"] if c["train_hours"] is not None]
                if curve:
                    x = [
                        c["train_hours"] if against_hours else c["step"] * run["step_scale"] / 1000
                        for c in curve
                    ]
                    ax.plot(
                        x, [c[metric] for c in curve], marker="o", markersize=3, label=f"seed {run['seed']}"
                    )
            if against_hours:
                ax.axhline(points[-1][1], color="k", linestyle="--", linewidth=1, label="published at 100k")
                ax.set_xlim(left=0)
            else:  # the published curve is known only at these steps: points, not a line between them
                ax.plot([p[0] / 1000 for p in points], [p[1] for p in points], "kx", label="published (CSV)")
                ax.set_xlim(0, STEPS / 1000 * 1.02)
            ax.set_title(name, fontsize=9)
            ax.set_ylim(0, 1000 if suite == "dmc" else 100)
            unit = "agent steps" if reproduction.tasks[name].step_scale == 1 else "simulator steps"
            ax.set_xlabel("training hours" if against_hours else f"{unit} (thousands)", fontsize=8)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("eval return" if suite == "dmc" else "eval success (%)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    variant = f", with {' '.join(args.set)}" if args.set else ""
    fig.suptitle(
        f"{reproduction.title} ({args.size}-sized recipes{variant}), 10 evaluation episodes per point",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def verdict(figure: float, published: float, spread: tuple[float, float] | None) -> str:
    """The figure against the published one: a match within 10% of it or inside its seeds' spread."""
    ratio = figure / published
    inside = spread is not None and spread[0] <= figure <= spread[1]
    word = "match" if abs(ratio - 1) <= 0.1 or inside else "above" if ratio > 1 else "short"
    return f"{figure:.1f} ({ratio:.2f}x): {word}"


def report(args: argparse.Namespace) -> None:
    """The table (latest evaluation of each run against the published figure) and the curves."""
    reproduction = REPRODUCTIONS[args.policy]
    runs = _curves(args)
    results_file, plot_file, hours_plot_file = _outputs(args)
    _plot(args, runs, against_hours=False, path=plot_file)
    _plot(args, runs, against_hours=True, path=hours_plot_file)
    out = {
        "size": args.size,
        "policy": args.policy,
        "recipes": {f"{k[0]}": v for k, v in reproduction.recipes.items() if k[1] == args.size},
        "overrides": args.set,
        "runs": runs,
        "seed_means": {n: {"seeds": f, "mean": m} for n, (f, m) in _seed_means(reproduction, runs).items()},
    }
    results_file.write_text(json.dumps(out, indent=1))
    simulator = any(t.step_scale > 1 for t in reproduction.tasks.values())
    unit = "simulator steps" if simulator else "agent steps"
    print(
        f"| run | published at 100k | evaluations (thousands of {unit}: figure) | training hours | at 100k |"
    )
    print("|---|---|---|---|---|")
    for key, r in runs.items():
        curve, metric, name = r["curve"], r["metric"], r["task"]
        points = ", ".join(f"{c['step'] * r['step_scale'] / 1000:g}k: {c[metric]:.0f}" for c in curve)
        hours = curve[-1]["train_hours"]
        task = reproduction.tasks[name]
        final = [c[metric] for c in curve if c["step"] == task.agent_steps]
        at_100k = verdict(final[0], r["published"], task.spread) if final else "running"
        hours_text = f"{hours:.2f}" if hours is not None else "?"
        beside = f" ({task.beside[0]}: {task.beside[1]:.1f})" if task.beside else ""
        published = f"{r['published']:.1f}{beside}"
        print(f"| {key} | {published} | {points} | {hours_text} | {at_100k} |")
    if means := _seed_means(reproduction, runs):
        print("\n| task | published at 100k | seeds at 100k | mean over seeds |")
        print("|---|---|---|---|")
        for name, (finals, mean) in means.items():
            task = reproduction.tasks[name]
            figures = ", ".join(f"{f:.1f}" for f in finals)
            print(
                f"| {name} | {task.published[-1][1]:.1f} | {figures} | {verdict(mean, task.published[-1][1], None)} |"
            )
    print(f"wrote {results_file}, {plot_file} and {hours_plot_file}")


def _seed_means(reproduction: Reproduction, runs: dict) -> dict[str, tuple[list[float], float]]:
    """Tasks with two or more seeds at the end of their budget: {task: (each seed's figure, their mean)}, the
    mean being what a published mean over seeds compares with (within 10% of it)."""
    finals: dict[str, list[float]] = {}
    for r in runs.values():
        task = reproduction.tasks[r["task"]]
        finals.setdefault(r["task"], []).extend(
            c[r["metric"]] for c in r["curve"] if c["step"] == task.agent_steps
        )
    return {n: (f, sum(f) / len(f)) for n, f in finals.items() if len(f) >= 2}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("run", "report"):
        p = sub.add_parser(cmd)
        p.add_argument("--size", choices=("cpu", "paper"), default="cpu")
        p.add_argument("--policy", choices=list(REPRODUCTIONS), default="tdmpc")
        p.add_argument("--root", default=None, help="default: outputs/<policy>_reproduce")
        p.add_argument(
            "--set", nargs="+", default=[], metavar="KEY=VALUE", help="more overrides (needs --tag)"
        )
        p.add_argument("--tag", default="", help="the variant's name: its run directories and report files")
        if cmd == "run":  # the report covers every run under the root, whichever queue made it
            p.add_argument("--runs", nargs="+", help="task names of the policy's table (default: all)")
            p.add_argument("--seeds", type=int, nargs="+", default=[1])
            p.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.set and not args.tag:
        parser.error("--set needs --tag NAME: a variant's runs must not share the recipes' directories")
    if bad := [o for o in args.set if "=" not in o]:
        parser.error(f"--set takes KEY=VALUE overrides; got {bad}")
    tasks = REPRODUCTIONS[args.policy].tasks
    if args.cmd == "run":
        args.runs = args.runs or list(tasks)
        if unknown := [r for r in args.runs if r not in tasks]:
            parser.error(f"--runs: {unknown} not in {args.policy}'s table; choose from {', '.join(tasks)}")
    {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
