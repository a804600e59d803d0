"""Benchmarks of TD-MPC and multi-env online training.

    python benchmarks/bench_online.py timing            # planning call (batch 1, 8) and gradient update times
    python benchmarks/bench_online.py compare           # Pendulum: n_envs 1/4/8 x gradient_steps 1/-1
    python benchmarks/bench_online.py final             # last checkpoint of each run on 20 episodes
    python benchmarks/bench_online.py plot              # redraw the PNG from the saved JSON
    python benchmarks/bench_online.py dmc-timing        # DMC, the paper's settings: seconds per agent step
    python benchmarks/bench_online.py precision         # DMC recipes: planning and update in bf16 vs float32

Results go to `benchmarks/results/online.json` (sections `timing`, `pendulum`, `dmc_timing` and `precision`) and `online.png`.

`dmc-timing` trains TD-MPC with configs/experiment/tdmpc_dmc.yaml (or `--recipe tdmpc_dmc_cpu`) on one DMC task
for `--steps` agent steps after `--learning-starts` random ones (a small seed phase, for the timing only),
splits the time of an agent step into planning, the env step, the rest of the collection (observation
conversion, replay buffer) and the update (the run's `collect_s` and `update_s`, over the log windows after
`--warmup-windows`; planning and env steps timed call by call inside the run; the warm-up schedule and the burst
of updates are off, so every step is a steady-state one), and extrapolates the recipe's 100,000 agent steps:
5,000 random steps, 5,000 updates at once, 95,000 steps with an update each (at the full planning horizon: the
schedule's first 25,000 steps plan less far, so this slightly overstates), and 10 evaluations of 10 episodes
(500 planning calls at batch 10 each, that call timed alone).

`compare` trains one run per (n_envs, gradient_steps) on the same budget of env transitions and evaluates each
run every `--eval-freq` transitions on the same `--eval-episodes` seeded episodes. It uses the CPU-sized
model and planner of docs/tdmpc.md (the paper's planner is sized for a GPU). With
n_envs=1 and train_freq=1, gradient_steps=-1 is the same schedule as gradient_steps=1, so that run is done
once and reported for both.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import common  # first: it sets OMP_WAIT_POLICY before torch loads
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lerobot.cli import compose_config  # noqa: E402
from lerobot.config import env_config  # noqa: E402
from lerobot.policy_registry import make_policy, make_policy_config  # noqa: E402
from lerobot.training.update import TrainStep  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
RESULTS_FILE = RESULTS / "online.json"
PLOT_FILE = RESULTS / "online.png"

# CPU-sized TD-MPC for Pendulum (see docs/tdmpc.md); everything else is the paper's default.
CPU_OVERRIDES = [
    "policy.latent_dim=32",
    "policy.enc_dim=128",
    "policy.mlp_dim=128",
    "policy.num_samples=128",
    "policy.num_elites=16",
    "policy.num_pi_trajs=8",
    "policy.iterations=3",
    "training.batch_size=128",
]


def _load_section(name: str) -> dict:
    """One section of the results file (empty when there is none yet)."""
    results = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {}
    return results.get(name, {"runs": {}} if name == "pendulum" else {})


def _save_section(name: str, section: dict) -> None:
    """Replace one section of the results file, keeping the others."""
    results = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {}
    results[name] = section
    RESULTS.mkdir(parents=True, exist_ok=True)
    RESULTS_FILE.write_text(json.dumps(results, indent=2))


def _load() -> float:
    return os.getloadavg()[0]


def _time(fn, repeats: int, warmup: int = 2) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times), "repeats": repeats}


def timing(args: argparse.Namespace) -> dict:
    """Planning call at batch 1 and 8, and one gradient update, for the paper's and the CPU settings."""
    torch.set_num_threads(args.threads)
    out = {"threads": args.threads, "cpu": platform.processor() or platform.machine(), "settings": {}}
    for name, overrides in (("paper", []), ("cpu", CPU_OVERRIDES)):
        cfg = compose_config(["policy=tdmpc", "env=pendulum", *overrides])
        policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
        if cfg.training.batch_size:
            policy_cfg.batch_size = cfg.training.batch_size
        torch.manual_seed(0)
        policy = make_policy(policy_cfg).eval()
        res: dict = {"load_before": _load()}
        for batch_size in (1, 8):
            obs = {"observation.state": torch.randn(batch_size, 3)}
            policy.reset()
            res[f"plan_b{batch_size}"] = _time(lambda o=obs, p=policy: p.select_action(o), args.repeats)
        b, h = policy_cfg.batch_size, policy.replay_horizon
        batch = {
            "observation.state": torch.randn(b, h + 1, 3),
            "action": torch.rand(b, h, 1) * 4 - 2,
            "next.reward": -16 * torch.rand(b, h),
            "next.terminated": torch.zeros(b, h, dtype=torch.bool),
        }
        # The online trainer's update: `TrainStep`, then the target network's EMA step.
        step = TrainStep(policy, policy_cfg, cfg.training, total_updates=args.repeats + 2)

        def update(batch=batch, policy=policy, step=step):
            step(batch, where="benchmark update")
            policy.update_target()

        res["update"] = _time(update, args.repeats)
        res["batch_size"] = b
        res["load_after"] = _load()
        out["settings"][name] = res
        print(name, json.dumps(res, indent=1))
    _save_section("timing", out)
    return out


def precision(args: argparse.Namespace) -> dict:
    """bf16 against float32 for the two costs of a TD-MPC agent step (DMC recipes, cartpole-swingup's
    sizes): a planning call for one env with and without bf16 autocast, and one update with
    `training.use_amp` false and true (the same `TrainStep` the trainer runs, then the EMA step)."""
    torch.set_num_threads(args.threads)
    out: dict = {"machine": common.machine_info(), "threads": args.threads, "recipes": {}}
    for recipe in DMC_RECIPES:
        cfg = compose_config([f"+experiment={recipe}", "env=dmc_cartpole_swingup"])
        policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
        torch.manual_seed(0)
        policy = make_policy(policy_cfg).eval()
        obs = {"observation.state": torch.randn(1, 5)}
        res: dict = {"load_before": _load()}
        for name, autocast in (("plan_fp32", False), ("plan_bf16_autocast", True)):

            def plan(autocast=autocast, policy=policy, obs=obs):
                policy.reset()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    policy.select_action(obs)

            res[name] = _time(plan, args.repeats)
        b, h = cfg.training.batch_size, policy.replay_horizon
        batch = {
            "observation.state": torch.randn(b, h + 1, 5),
            "action": torch.rand(b, h, 1) * 2 - 1,
            "next.reward": torch.rand(b, h),
            "next.terminated": torch.zeros(b, h, dtype=torch.bool),
        }
        for amp in ("false", "true"):
            cfg.training.use_amp = amp
            step = TrainStep(policy, policy_cfg, cfg.training, total_updates=args.repeats + 2)

            def update(step=step, batch=batch, policy=policy):
                step(batch, where="benchmark update")
                policy.update_target()

            res[f"update_amp_{amp}"] = _time(update, args.repeats)
        res["load_after"] = _load()
        out["recipes"][recipe] = res
        print(recipe, json.dumps(res, indent=1))
    _save_section("precision", out)
    return out


def _read_metrics(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train = {r["step"]: r for r in records if r["split"] == "train"}
    curve = []
    for r in records:
        if r["split"] != "eval":
            continue
        t = train.get(r["step"], {})
        curve.append(
            {
                "transitions": r["step"],
                "train_time_s": t.get("train_time_s"),
                "updates": t.get("updates"),
                "eval_return": r["avg_sum_reward"],
            }
        )
    returns = [
        {"transitions": s, "train_time_s": r["train_time_s"], "episode_return": r["episode_return"]}
        for s, r in sorted(train.items())
        if "episode_return" in r
    ]
    return {"eval": curve, "train_returns": returns}


def compare(args: argparse.Namespace) -> dict:
    """Train every (n_envs, gradient_steps) on the same transition budget; collect eval curves."""
    from lerobot.training.online import train_online

    torch.set_num_threads(args.threads)
    results = _load_section("pendulum") if args.keep else {"runs": {}}
    results["settings"] = {
        "steps": args.steps,
        "learning_starts": args.learning_starts,
        "eval_freq": args.eval_freq,
        "eval_episodes": args.eval_episodes,
        "seed": args.seed,
        "threads": args.threads,
        "overrides": CPU_OVERRIDES,
    }
    work = Path(args.work_dir)
    for n_envs in args.n_envs:
        for gradient_steps in args.gradient_steps:
            key = f"n{n_envs}_g{gradient_steps}"
            if n_envs == 1 and gradient_steps == -1 and 1 in args.gradient_steps:
                continue  # identical schedule to gradient_steps=1 (train_freq=1): reported from that run
            if key in results["runs"]:
                continue
            run_dir = work / key
            shutil.rmtree(run_dir, ignore_errors=True)
            cfg = compose_config(
                [
                    "policy=tdmpc",
                    "env=pendulum",
                    *CPU_OVERRIDES,
                    f"training.steps={args.steps}",
                    f"training.n_envs={n_envs}",
                    f"training.gradient_steps={gradient_steps}",
                    f"training.learning_starts={args.learning_starts}",
                    f"training.log_freq={args.eval_freq}",
                    f"training.save_freq={10 * args.steps}",
                    f"eval.freq={args.eval_freq}",
                    f"eval.n_episodes={args.eval_episodes}",
                    f"eval.batch_size={args.eval_episodes}",
                    "eval.max_episodes_rendered=0",
                    "eval.use_async_envs=false",
                    f"seed={args.seed}",
                    f"output_dir={run_dir}",
                ]
            )
            t0 = time.perf_counter()
            train_online(cfg, make_policy_config(cfg.policy, env_config(cfg)), progress=not args.quiet)
            wall = time.perf_counter() - t0
            results["runs"][key] = {
                "n_envs": n_envs,
                "gradient_steps": gradient_steps,
                "wall_s": wall,
                "load_avg_end": _load(),
                **_read_metrics(run_dir),
            }
            _save_section("pendulum", results)
            last = results["runs"][key]["eval"][-1]
            print(
                f"{key}: final eval return {last['eval_return']:.1f}, train time {last['train_time_s']:.0f} s"
            )
    plot(args)
    return results


def final_eval(args: argparse.Namespace) -> dict:
    """Evaluate every run's last checkpoint on more episodes; `pc_solved` = % of episodes with return > -400."""
    from lerobot.checkpoints.run import load_run_policy
    from lerobot.checkpoints.run_layout import latest_checkpoint
    from lerobot.envs import make_env
    from lerobot.rollout import eval_policy

    torch.set_num_threads(args.threads)
    results = _load_section("pendulum")
    for key, run in sorted(results["runs"].items()):
        policy, cfg = load_run_policy(latest_checkpoint(Path(args.work_dir) / key))
        env = make_env(env_config(cfg), args.final_episodes)
        try:
            info = eval_policy(
                env, policy, args.final_episodes, start_seed=cfg.eval.start_seed, progress=False
            )
        finally:
            env.close()
        returns = [ep["sum_reward"] for ep in info["per_episode"]]
        run["final_eval"] = {
            "n_episodes": len(returns),
            "mean_return": statistics.mean(returns),
            "median_return": statistics.median(returns),
            "pc_solved": 100.0 * sum(r > -400 for r in returns) / len(returns),
        }
        print(key, run["final_eval"])
    _save_section("pendulum", results)
    return results


def plot(args: argparse.Namespace) -> None:
    """Eval return vs transitions and vs training wall time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _load_section("pendulum")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for _key, run in sorted(results["runs"].items()):
        label = f"n_envs={run['n_envs']}, gradient_steps={run['gradient_steps']}"
        if run["n_envs"] == 1:
            label += " (= -1)"
        xs = [p["transitions"] for p in run["eval"]]
        ts = [p["train_time_s"] for p in run["eval"]]
        ys = [p["eval_return"] for p in run["eval"]]
        style = "-" if run["gradient_steps"] == -1 or run["n_envs"] == 1 else "--"
        axes[0].plot(xs, ys, style, marker="o", markersize=3, label=label)
        axes[1].plot(ts, ys, style, marker="o", markersize=3, label=label)
    axes[0].set_xlabel("env transitions (all envs)")
    axes[1].set_xlabel("training wall time (s, eval excluded)")
    for ax in axes:
        ax.set_ylabel("eval return (Pendulum-v1)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    s = results["settings"]
    fig.suptitle(f"TD-MPC on Pendulum-v1, seed {s['seed']}, {s['eval_episodes']} eval episodes per point")
    fig.tight_layout()
    fig.savefig(PLOT_FILE, dpi=90)
    print(f"wrote {PLOT_FILE}")


# The recipes being extrapolated (configs/experiment/tdmpc_dmc.yaml and its CPU-sized tdmpc_dmc_cpu.yaml):
# agent steps, random ones, updates at once when learning starts, evaluations.
DMC_RECIPES = ("tdmpc_dmc", "tdmpc_dmc_cpu")
DMC_STEPS, DMC_SEED_STEPS, DMC_INITIAL_UPDATES = 100_000, 5000, 5000
DMC_EVALS, DMC_EVAL_EPISODES, DMC_EPISODE_STEPS = 10, 10, 500


def _timed(cls: type, name: str, durations: list[float]) -> None:
    """Wrap the method `cls.name` so that each call appends its wall time to `durations` (benchmark only)."""
    method = getattr(cls, name)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - t0)

    setattr(cls, name, wrapper)


def dmc_timing(args: argparse.Namespace) -> dict:
    """Seconds per agent step of TD-MPC online training on a DMC task with the paper's settings, split into
    planning, env step and update, and the recipe's 100,000 steps extrapolated from them."""
    from lerobot.envs.dmc import DMCEnv
    from lerobot.policies.tdmpc.modeling import TDMPCPolicy
    from lerobot.training.online import train_online

    torch.set_num_threads(args.threads)
    machine = common.machine_info()
    run_dir = Path(args.work_dir) / f"dmc_timing_{args.env}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        f"+experiment={args.recipe}",
        f"env={args.env}",
        # Steady state only: no burst of updates at the start (extrapolated below) and the full planning
        # horizon from the first step (the warm-up schedule's shorter plans would make planning look cheaper).
        "training.initial_updates=0",
        "policy.schedule_steps=0",
        *args.set,
        f"training.steps={args.learning_starts + args.steps}",
        f"training.learning_starts={args.learning_starts}",
        f"training.log_freq={args.log_freq}",
        f"training.save_freq={10 * (args.learning_starts + args.steps)}",
        "training.save_buffer=false",
        "eval.freq=0",
        f"seed={args.seed}",
        f"output_dir={run_dir}",
    ]
    cfg = compose_config(overrides)
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    # Inside the run: every planning call (one per agent step once learning starts: 1 env, 1 action per
    # plan) and every env step.
    plan_s: list[float] = []
    env_step_s: list[float] = []
    _timed(TDMPCPolicy, "predict_action_chunk", plan_s)
    _timed(DMCEnv, "step", env_step_s)
    t0 = time.perf_counter()
    train_online(cfg, policy_cfg, progress=False)
    wall_s = time.perf_counter() - t0
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in train if r["split"] == "train"]
    random_windows = [r for r in train if r["step"] <= args.learning_starts]
    warmup = args.warmup_windows * args.log_freq
    first_timed = args.learning_starts + warmup
    timed = [r for r in train if r["step"] - args.log_freq >= first_timed]
    if not timed:
        raise SystemExit(f"no log window after {first_timed} steps: raise --steps or lower --log-freq")
    collect_s = statistics.mean(r["collect_s"] for r in timed)
    update_s = statistics.mean(r["update_s"] for r in timed)
    updates_per_step = statistics.mean(r["updates_per_transition"] for r in timed)
    random_step_s = statistics.mean(r["collect_s"] for r in random_windows) if random_windows else None
    planning = statistics.mean(plan_s[warmup:])
    env_step = statistics.mean(env_step_s[first_timed:])

    # Evaluation plans 10 episodes at once: that call timed alone, on fresh weights of the run's config (its
    # cost does not depend on the weights).
    (obs_dim,) = env_config(cfg).features["observation.state"].shape
    torch.manual_seed(0)
    policy = make_policy(policy_cfg).eval()
    obs = {"observation.state": torch.randn(DMC_EVAL_EPISODES, obs_dim)}
    plan_eval_s = _time(lambda: policy.select_action(obs), args.repeats)["median_ms"] / 1e3

    step_s = collect_s + update_s * updates_per_step
    learning_steps = DMC_STEPS - DMC_SEED_STEPS
    eval_s = DMC_EVALS * DMC_EPISODE_STEPS * (plan_eval_s + DMC_EVAL_EPISODES * env_step)
    seed_s = DMC_SEED_STEPS * (random_step_s if random_step_s is not None else env_step)
    initial_s = DMC_INITIAL_UPDATES * update_s
    total_s = seed_s + initial_s + learning_steps * step_s + eval_s
    result = {
        "machine": machine,
        "threads": args.threads,
        "overrides": overrides,
        "wall_s": wall_s,
        "timed_steps": timed[-1]["step"] - first_timed,
        "per_agent_step_s": {
            "total": step_s,
            "planning": planning,
            "env_step": env_step,
            "collect_other": collect_s - planning - env_step,
            "update": update_s * updates_per_step,
        },
        "update_s": update_s,
        "updates_per_step": updates_per_step,
        # Each timed log window: the load on a shared machine moves these more than anything else.
        "windows": [
            {"step": r["step"], "collect_s": r["collect_s"], "update_s": r["update_s"]} for r in timed
        ],
        "random_step_s": random_step_s,
        "eval_plan_batch10_s": plan_eval_s,
        "extrapolated_100k_h": {
            "seed_steps": seed_s / 3600,
            "initial_updates": initial_s / 3600,
            "learning_steps": learning_steps * step_s / 3600,
            "evaluations": eval_s / 3600,
            "total": total_s / 3600,
        },
        "load_avg_end": _load(),
    }
    results = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {}
    section = results.get("dmc_timing", {})
    section[":".join([args.recipe, args.env, *args.set])] = result
    _save_section("dmc_timing", section)
    print(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("precision")
    pr.add_argument("--repeats", type=int, default=10)
    pr.add_argument("--threads", type=int, default=1)
    t = sub.add_parser("timing")
    t.add_argument("--repeats", type=int, default=10)
    t.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--steps", type=int, default=6000)
    c.add_argument("--learning-starts", type=int, default=1000)
    c.add_argument("--eval-freq", type=int, default=1000)
    c.add_argument("--eval-episodes", type=int, default=4)
    c.add_argument("--n-envs", type=int, nargs="+", default=[1, 4, 8])
    c.add_argument("--gradient-steps", type=int, nargs="+", default=[1, -1])
    c.add_argument("--seed", type=int, default=1000)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--work-dir", default="/tmp/bench_online")
    c.add_argument(
        "--keep", action="store_true", help="keep runs already in the JSON and add the missing ones"
    )
    c.add_argument("--quiet", action="store_true")
    f = sub.add_parser("final")
    f.add_argument("--final-episodes", type=int, default=20)
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--work-dir", default="/tmp/bench_online")
    sub.add_parser("plot")
    d = sub.add_parser("dmc-timing")
    d.add_argument("--env", default="dmc_cartpole_swingup")
    d.add_argument("--recipe", choices=DMC_RECIPES, default="tdmpc_dmc")
    d.add_argument("--set", nargs="*", default=[], help="more overrides, e.g. training.use_amp=true")
    d.add_argument("--steps", type=int, default=2000, help="agent steps timed after learning starts")
    d.add_argument("--learning-starts", type=int, default=500)
    d.add_argument("--log-freq", type=int, default=250)
    d.add_argument("--warmup-windows", type=int, default=1, help="log windows after learning starts left out")
    d.add_argument("--repeats", type=int, default=20)
    d.add_argument("--threads", type=int, default=torch.get_num_threads())
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--work-dir", default="/tmp/bench_online")
    args = parser.parse_args()
    commands = {
        "timing": timing,
        "precision": precision,
        "compare": compare,
        "final": final_eval,
        "plot": plot,
        "dmc-timing": dmc_timing,
    }
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
