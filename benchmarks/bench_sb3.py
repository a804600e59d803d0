"""SAC (`policy=sac`) beside Stable-Baselines3's SAC: returns, wall time and update speed.

    python benchmarks/bench_sb3.py                    # the Pendulum sweep (resumes; results/sb3_pendulum.json)
    python benchmarks/bench_sb3.py --suite dmc        # DeepMind Control sweep (results/sb3_dmc.json)
    python benchmarks/bench_sb3.py --report           # tables (results/sb3_<suite>.md) and plot (.png) only
    python benchmarks/bench_sb3.py --speed            # one update of each, and the floor (results/sb3_speed.json)

Needs `pip install -e ".[bench]"` (stable-baselines3 2.9.2); DMC also `[mujoco]`.

The sweep trains both implementations on the same envs: this project's gymnasium envs (`configs/env/*.yaml`,
`lerobot.envs.make_single_env`), vectorised by the trainer for ours and by SB3's `DummyVecEnv` over the same
factory for SB3 (the state vector handed over as a plain Box). Both take their hyperparameters from one
composed config (`+experiment=sac_pendulum` / `sac_dmc` with the setting's overrides): learning rate, batch,
tau, discount, hidden widths, entropy target and initial temperature, buffer size, learning_starts, and SB3's
schedule (`train_freq=1` vector step, `gradient_steps` per vector step; -1: as many as transitions collected),
on the same seeds (env i of a run reset with `seed + i`) for the same number of transitions. Each is evaluated
every `eval_every` transitions, after that collection's updates, on the same episodes (seeds 100,000 + k) by
the project's evaluation (`lerobot.evaluation.evaluate`), with the deterministic action (tanh of the mean).

Wall time: ours from the trainer's log (`train_time_s`; `collect_s` per vector step and `update_s` per update,
summed over the log windows); SB3's by timing its `collect_rollouts` and `train` calls; evaluations, start-up
and checkpoints are left out of both. Every run is one subprocess on one thread (`torch.set_num_threads(1)`,
OMP/MKL at 1), one at a time; launch the sweep under `nice -n 10` on a shared machine. Each finished run is
appended to the results JSON at once, so a sweep cut short resumes where it stopped (finished
(impl, env, setting, seed) are skipped).

`--speed` times one update of each in one process, alternating blocks of updates, on a filled replay buffer:
ours as the trainer makes it (`TrainStep`, the replay sample, the target step), in float32 and under bf16
autocast (what `training.use_amp=auto` picks on a CPU with native bf16), and SB3's `train(gradient_steps=1)`;
CPU time (`time.process_time`) and wall time. The floor: the update's matmul FLOPs (torch's
`FlopCounterMode` over ours, forward and backward) over the measured single-thread matmul rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # first: it sets OMP_WAIT_POLICY before torch loads
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lerobot.cli import compose_config, train_main  # noqa: E402
from lerobot.config import env_config  # noqa: E402
from lerobot.policy_registry import make_policy_config  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# ours: the recipe as a user runs it (bf16 autocast where the CPU has native bf16: training.use_amp=auto);
# ours_fp32: the same in float32 (training.use_amp=false); sb3: Stable-Baselines3's SAC.
IMPLS = ("ours", "sb3", "ours_fp32")
IMPL_NAMES = {"ours": "ours", "sb3": "SB3", "ours_fp32": "ours fp32"}
SUITES: dict[str, dict[str, Any]] = {
    "pendulum": {
        "experiment": "sac_pendulum",
        "envs": ["pendulum"],
        # (n_envs, gradient_steps per vector step)
        "settings": [(1, 1), (2, 1), (4, 1), (8, 1), (4, 2)],
        "steps": 20_000,
        "eval_every": 2_000,
        "eval_episodes": 20,
    },
    "dmc": {
        "experiment": "sac_dmc",
        "envs": ["dmc_cartpole_swingup", "dmc_walker_walk"],
        "settings": [(1, 1), (4, 1), (4, -1), (8, 1), (8, -1)],  # n_envs=1: -1 is the same schedule as 1
        "steps": 100_000,
        "eval_every": 10_000,
        "eval_episodes": 10,
    },
}


def run_key(run: dict) -> tuple:
    return (run["impl"], run["env"], run["n_envs"], run["gradient_steps"], run["seed"], run["steps"])


def overrides_of(spec: dict) -> list[str]:
    """The config overrides of one run (ours trains on them; SB3 reads its hyperparameters from them)."""
    return [
        f"+experiment={spec['experiment']}",
        f"env={spec['env']}",
        f"seed={spec['seed']}",
        f"training.steps={spec['steps']}",
        *(["training.use_amp=false"] if spec["impl"] == "ours_fp32" else []),
        f"training.n_envs={spec['n_envs']}",
        f"training.gradient_steps={spec['gradient_steps']}",
        "training.train_freq=1",
        "training.use_async_envs=false",
        f"training.log_freq={spec['eval_every']}",
        f"training.save_freq={spec['steps']}",
        f"eval.freq={spec['eval_every']}",
        f"eval.n_episodes={spec['eval_episodes']}",
        f"eval.batch_size={spec['eval_episodes']}",
        "eval.use_async_envs=false",
        "eval.max_episodes_rendered=0",
        *spec.get("extra", []),
    ]


# ------------------------------------------------------------------------------------------------ ours
def run_ours(spec: dict, work: Path) -> dict:
    """Train with the project's trainer (`scripts/train.py`) and read its log."""
    run_dir = work / "run"
    with cpu_clocks() as cpu_at:
        code = train_main([*overrides_of(spec), f"output_dir={run_dir}"])
    if code != 0:
        raise RuntimeError(f"train.py exited with {code}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    evals = {r["step"]: r for r in records if r["split"] == "eval"}
    curve, collect_s, update_s, prev_step, prev_updates = [], 0.0, 0.0, 0, 0.0
    for r in train:
        collect_s += r["collect_s"] * (r["step"] - prev_step) / spec["n_envs"]
        update_s += r.get("update_s", 0.0) * (r["updates"] - prev_updates)
        prev_step, prev_updates = r["step"], r["updates"]
        if r["step"] in evals:
            curve.append(
                {
                    "transitions": r["step"],
                    "return": evals[r["step"]]["avg_sum_reward"],
                    "wall_s": r["train_time_s"],
                    "collect_s": collect_s,
                    "update_s": update_s,
                    "updates": int(r["updates"]),
                    **cpu_at.get(r["step"], {}),
                }
            )
            if "cpu_collect_s" in curve[-1]:
                curve[-1]["cpu_s"] = curve[-1]["cpu_collect_s"] + curve[-1]["cpu_update_s"]
    return {"curve": curve}


@contextlib.contextmanager
def cpu_clocks():
    """CPU time (`time.process_time`) of the trainer's collections and updates, read at each evaluation:
    yields {transitions: {"cpu_collect_s", "cpu_update_s"}}, filled as the run evaluates. The trainer logs
    wall time only, which on a shared machine counts the time other jobs held the core; CPU time does not.
    Hooks the trainer's own functions (`Collector.collect`, `make_owed_updates`, `TrainingLoop.evaluate`);
    where one of them is not there (the trainer reorganised), nothing is hooked and the wall time stands
    alone."""
    from lerobot.training import collector, online, progress

    spent = {"cpu_collect_s": 0.0, "cpu_update_s": 0.0}
    at: dict[int, dict[str, float]] = {}
    targets = [
        (collector.Collector, "collect", "cpu_collect_s"),
        (online, "make_owed_updates", "cpu_update_s"),
    ]
    if not all(hasattr(owner, name) for owner, name, _ in targets) or not hasattr(
        progress.TrainingLoop, "evaluate"
    ):
        yield at
        return

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.process_time() - start

        return wrapper

    evaluate = progress.TrainingLoop.evaluate

    def evaluate_and_read(self, policy):
        at[self.step] = dict(spent)
        return evaluate(self, policy)

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    saved.append((progress.TrainingLoop, "evaluate", evaluate))
    for owner, name, key in targets:
        setattr(owner, name, timed(getattr(owner, name), key))
    progress.TrainingLoop.evaluate = evaluate_and_read
    try:
        yield at
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


# ------------------------------------------------------------------------------------------------- SB3
def run_sb3(spec: dict, work: Path) -> dict:
    """Train SB3's SAC with the run's hyperparameters on DummyVecEnv over the project's env factory."""
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.vec_env import DummyVecEnv

    from lerobot.envs import make_single_env
    from lerobot.evaluation import evaluate
    from lerobot.policies.policy import Policy

    cfg = compose_config(overrides_of(spec))
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    (obs_key,) = [k for k in policy_cfg.input_features]
    tcfg = cfg.training

    class StateOnly(gym.ObservationWrapper):
        """The project's env with its one observation feature handed to SB3 as a plain Box."""

        def __init__(self, env: gym.Env):
            super().__init__(env)
            self.observation_space = env.observation_space[obs_key]

        def observation(self, observation: dict) -> np.ndarray:
            return observation[obs_key]

    class SB3Actor(Policy):
        """SB3's deterministic action, acting through the project's `Policy` so that the project's own
        evaluation runs it on the same episodes as ours."""

        def __init__(self, model: SAC):
            super().__init__(n_obs_steps=1, n_action_steps=1)
            self.model = model
            self.config = policy_cfg  # the evaluation reads the policy's name from it

        def predict_action_chunk(self, batch: dict) -> torch.Tensor:
            obs = batch[obs_key][:, -1].numpy()
            action, _ = self.model.predict(obs, deterministic=True)
            return torch.as_tensor(action, dtype=torch.float32).unsqueeze(1)

        def forward(self, batch: dict) -> dict:
            raise NotImplementedError

    def make() -> gym.Env:
        return StateOnly(make_single_env(env_cfg))

    vec_env = DummyVecEnv([make] * spec["n_envs"])
    ent_coef = "auto" if policy_cfg.init_temperature == 1.0 else f"auto_{policy_cfg.init_temperature}"
    target_entropy = "auto" if policy_cfg.target_entropy is None else policy_cfg.target_entropy
    model = SAC(
        "MlpPolicy",
        vec_env,
        learning_rate=policy_cfg.optimizer_lr,
        buffer_size=tcfg.buffer_capacity,
        learning_starts=tcfg.learning_starts,
        batch_size=tcfg.batch_size or policy_cfg.batch_size,
        tau=policy_cfg.tau,
        gamma=policy_cfg.discount,
        train_freq=(tcfg.train_freq, "step"),
        gradient_steps=tcfg.gradient_steps,
        ent_coef=ent_coef,
        target_entropy=target_entropy,
        policy_kwargs={"net_arch": list(policy_cfg.hidden_dims)},
        seed=spec["seed"],
        device="cpu",
        verbose=0,
    )
    actor = SB3Actor(model)
    times = {"collect_s": 0.0, "update_s": 0.0, "updates": 0, "cpu_collect_s": 0.0, "cpu_update_s": 0.0}
    curve: list[dict] = []
    eval_every = spec["eval_every"]

    def evaluate_if_due() -> None:
        t = model.num_timesteps
        if t > 0 and t % eval_every == 0 and (not curve or curve[-1]["transitions"] < t):
            info = evaluate(cfg, actor, work / f"eval_{t}")
            curve.append(
                {
                    "transitions": t,
                    "return": info["aggregated"]["avg_sum_reward"],
                    "wall_s": times["collect_s"] + times["update_s"],
                    "cpu_s": times["cpu_collect_s"] + times["cpu_update_s"],
                    **times,
                }
            )

    collect_rollouts, train = model.collect_rollouts, model.train

    def timed_collect(*args, **kwargs):
        evaluate_if_due()  # after the last collection's updates, as the trainer evaluates
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return collect_rollouts(*args, **kwargs)
        finally:
            times["collect_s"] += time.perf_counter() - start
            times["cpu_collect_s"] += time.process_time() - cpu

    def timed_train(gradient_steps: int, batch_size: int = 64):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return train(gradient_steps, batch_size)
        finally:
            times["update_s"] += time.perf_counter() - start
            times["cpu_update_s"] += time.process_time() - cpu
            times["updates"] += gradient_steps

    model.collect_rollouts, model.train = timed_collect, timed_train
    model.learn(total_timesteps=spec["steps"])
    evaluate_if_due()
    vec_env.close()
    return {"curve": curve}


def run_one(spec: dict, out: Path) -> None:
    """One run in this process (a sweep's subprocess); its record is written to `out`."""
    torch.set_num_threads(1)
    before = common.machine_info()
    with tempfile.TemporaryDirectory(prefix="bench_sb3_") as tmp:
        start = time.perf_counter()
        result = (run_sb3 if spec["impl"] == "sb3" else run_ours)(spec, Path(tmp))
        elapsed = time.perf_counter() - start
    record = {
        **{k: spec[k] for k in ("impl", "env", "n_envs", "gradient_steps", "seed", "steps")},
        **result,
        "process_s": elapsed,
        "load_avg_1m": [before["load_avg_1m"], os.getloadavg()[0]],
        "date": before["date"],
    }
    out.write_text(json.dumps(record))


# ----------------------------------------------------------------------------------------------- sweep
RESULTS_OVERRIDE: Path | None = None  # --results


def results_path(suite: str) -> Path:
    return RESULTS_OVERRIDE or RESULTS / f"sb3_{suite}.json"


def load_results(suite: str) -> dict:
    path = results_path(suite)
    if path.exists():
        return json.loads(path.read_text())
    return {"suite": suite, "protocol": {}, "machine": common.machine_info(), "runs": []}


def save_results(suite: str, results: dict) -> None:
    path = results_path(suite)
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


def parse_setting(text: str) -> tuple[int, int]:
    n, g = text.split("x")
    return int(n), int(g)


def sweep(args: argparse.Namespace) -> None:
    suite = SUITES[args.suite]
    settings = [parse_setting(s) for s in args.settings] if args.settings else suite["settings"]
    envs = args.envs or suite["envs"]
    steps = args.steps or suite["steps"]
    protocol = {
        "experiment": suite["experiment"],
        "eval_every": args.eval_every or suite["eval_every"],
        "eval_episodes": suite["eval_episodes"],
        "threads": 1,
        "extra": list(args.extra),
    }
    results = load_results(args.suite)
    results["protocol"] = protocol
    done = {run_key(r) for r in results["runs"]}
    todo = [
        {"impl": impl, "env": env, "n_envs": n, "gradient_steps": g, "seed": seed, "steps": steps, **protocol}
        for seed in args.seeds
        for env in envs
        for n, g in settings
        for impl in args.impls
    ]
    todo = [spec for spec in todo if run_key(spec) not in done]
    print(f"{len(todo)} runs to do ({len(done)} already in {results_path(args.suite)})", flush=True)
    env_vars = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for i, spec in enumerate(todo):
        with tempfile.TemporaryDirectory(prefix="bench_sb3_run_") as tmp:
            out, log = Path(tmp) / "run.json", Path(tmp) / "run.log"
            cmd = [sys.executable, __file__, "--one", json.dumps(spec), "--out", str(out)]
            start = time.perf_counter()
            with open(log, "w") as f:
                code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_vars, cwd=REPO)
            if code != 0:
                print(log.read_text()[-3000:], flush=True)
                raise SystemExit(f"run {spec} failed with exit code {code}")
            record = json.loads(out.read_text())
        results = load_results(args.suite)  # another sweep may have appended meanwhile
        results["protocol"] = protocol
        results["runs"].append(record)
        save_results(args.suite, results)
        last = record["curve"][-1]
        print(
            f"[{i + 1}/{len(todo)}] {spec['impl']:4s} {spec['env']} n_envs={spec['n_envs']} "
            f"gradient_steps={spec['gradient_steps']} seed={spec['seed']}: return {last['return']:.1f} at "
            f"{last['transitions']}, train {last['wall_s']:.0f} s (process {time.perf_counter() - start:.0f} s, "
            f"load {os.getloadavg()[0]:.1f}) {time.strftime('%H:%M')}",
            flush=True,
        )
    report(args)


# ---------------------------------------------------------------------------------------------- report
def setting_name(n: int, g: int) -> str:
    return f"{n} env{'s' if n > 1 else ''}, gradient_steps={g}"


def grouped(results: dict) -> dict[tuple, dict[str, list[dict]]]:
    """{(env, n_envs, gradient_steps, steps): {impl: [runs]}} in the sweep's order."""
    out: dict[tuple, dict[str, list[dict]]] = {}
    for r in results["runs"]:
        out.setdefault((r["env"], r["n_envs"], r["gradient_steps"], r["steps"]), {}).setdefault(
            r["impl"], []
        ).append(r)
    return out


def returns_at(runs: list[dict], transitions: int) -> list[float]:
    return [p["return"] for r in runs for p in r["curve"] if p["transitions"] == transitions]


def per_10k(runs: list[dict], key: str) -> float:
    """Median over seeds of `key` seconds per 10,000 transitions over the whole run."""
    return statistics.median(r["curve"][-1][key] / r["curve"][-1]["transitions"] * 1e4 for r in runs)


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.0f} ± {std:.0f}"


def report(args: argparse.Namespace) -> None:
    results = load_results(args.suite)
    if not results["runs"]:
        print("no runs yet")
        return
    groups = grouped(results)
    machine = results.get("machine", {})
    lines = [
        f"# SAC beside Stable-Baselines3: {args.suite}",
        "",
        f"`python benchmarks/bench_sb3.py --suite {args.suite}`; {machine.get('cpu', '?')}, "
        f"{machine.get('cores', '?')} cores shared with other jobs, one thread per run, torch "
        f"{machine.get('torch', '?')}. Return: mean ± std over seeds of the evaluation's avg_sum_reward "
        f"({results['protocol'].get('eval_episodes', '?')} episodes). Time: seconds per 10,000 transitions "
        "(median over seeds), collection + updates.",
        "",
    ]
    impls = [i for i in ("ours", "sb3", "ours_fp32") if any(i in g for g in groups.values())]
    points = {key: (key[3] // 5, key[3] // 2, key[3]) for key in groups}
    header = ["env", "setting"] + [
        f"{IMPL_NAMES[i]} at {t:,}" for i in impls for t in next(iter(points.values()))
    ]
    lines += ["Return (mean ± std over seeds; seeds per implementation in brackets):", ""]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for key, runs in groups.items():
        env, n, g, _ = key
        row = [env, setting_name(n, g)]
        for impl in impls:
            row += [
                f"{mean_std(returns_at(runs.get(impl, []), t))} [{len(runs.get(impl, []))}]"
                for t in points[key]
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Seconds per 10,000 transitions, collection + updates (median over seeds), and SB3's time over each; "
        "wall time, then CPU time (`time.process_time`: what the run would take alone on its core):",
        "",
        "| env | setting | implementation | collect | update | total | SB3 / this | CPU s: collect | update "
        "| total | SB3 / this |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, runs in groups.items():
        env, n, g, _ = key
        sb3 = runs.get("sb3")
        for impl in impls:
            if not runs.get(impl):
                continue
            total = per_10k(runs[impl], "wall_s")
            speed = f"**{per_10k(sb3, 'wall_s') / total:.2f}x**" if sb3 and impl != "sb3" else ""
            row = [env, setting_name(n, g), IMPL_NAMES[impl]]
            row += [f"{per_10k(runs[impl], k):.0f}" for k in ("collect_s", "update_s")] + [
                f"{total:.0f}",
                speed,
            ]
            if all("cpu_s" in r["curve"][-1] for r in runs[impl] + (sb3 or [])):
                cpu = per_10k(runs[impl], "cpu_s")
                row += [f"{per_10k(runs[impl], k):.0f}" for k in ("cpu_collect_s", "cpu_update_s")]
                row += [f"{cpu:.0f}", f"**{per_10k(sb3, 'cpu_s') / cpu:.2f}x**" if impl != "sb3" else ""]
            else:
                row += ["", "", "", ""]
            lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    md = results_path(args.suite).with_suffix(".md")
    md.write_text(text)
    print(text)
    plot(args.suite, groups)


def plot(suite: str, groups: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(groups)
    # Rows: return against transitions, against the wall clock, against CPU time (what the run would take
    # alone on its core: the wall clock of a shared machine also counts the other jobs).
    xlabels = [
        "transitions",
        "wall clock of collection + updates (min)",
        "CPU time of collection + updates (min)",
    ]
    fig, axes = plt.subplots(3, len(keys), figsize=(3.6 * len(keys), 9.2), squeeze=False)
    colors = {"ours": "tab:blue", "sb3": "tab:orange", "ours_fp32": "tab:green"}
    labels = {"ours": "ours (policy=sac)", "sb3": "SB3 SAC", "ours_fp32": "ours, float32"}

    def mean_of(runs: list[dict], key: str, t: int) -> float:
        values = [p.get(key) for r in runs for p in r["curve"] if p["transitions"] == t]
        return statistics.mean(values) if values and None not in values else float("nan")

    for col, key in enumerate(keys):
        env, n, g, _ = key
        for impl, runs in groups[key].items():
            points = sorted({p["transitions"] for r in runs for p in r["curve"]})
            points = [t for t in points if len(returns_at(runs, t)) == len(runs)]
            if not points:
                continue
            mean = np.array([statistics.mean(returns_at(runs, t)) for t in points])
            std = np.array([np.std(returns_at(runs, t), ddof=1 if len(runs) > 1 else 0) for t in points])
            wall = np.array([mean_of(runs, "wall_s", t) for t in points]) / 60
            cpu = np.array([mean_of(runs, "cpu_s", t) for t in points]) / 60
            for row, x in enumerate((np.array(points), wall, cpu)):
                ax = axes[row][col]
                ax.plot(x, mean, color=colors[impl], label=f"{labels[impl]} ({len(runs)} seeds)")
                ax.fill_between(x, mean - std, mean + std, color=colors[impl], alpha=0.2)
        axes[0][col].set_title(f"{env}\n{setting_name(n, g)}", fontsize=9)
        for row, label in enumerate(xlabels):
            axes[row][col].set_xlabel(label, fontsize=8)
            axes[row][col].grid(alpha=0.3)
            axes[row][0].set_ylabel("evaluation return")
        axes[0][col].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = results_path(suite).with_suffix(".png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------------------------- speed
def matmul_rate(dtype: torch.dtype, size: int = 256, repeats: int = 400) -> float:
    """Single-thread GFLOP/s of a (size x size) @ (size x size) matmul in `dtype`, median of 7 blocks of CPU
    time."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    for _ in range(50):
        a @ b
    blocks = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(repeats):
            a @ b
        blocks.append((time.process_time() - start) / repeats)
    return 2 * size**3 / statistics.median(blocks) / 1e9


def speed(args: argparse.Namespace) -> None:
    """Per-update time of ours (float32, bf16 autocast) and SB3, interleaved; the FLOP floor."""
    import copy

    import gymnasium as gym
    from stable_baselines3 import SAC
    from torch.utils.flop_counter import FlopCounterMode

    from lerobot.policy_registry import make_policy
    from lerobot.training.collector import Collector
    from lerobot.training.demonstrations import sample_mixed
    from lerobot.training.online_state import Counts
    from lerobot.training.replay_buffer import ReplayBuffer
    from lerobot.training.schedule import UpdateSchedule
    from lerobot.training.update import TrainStep, shard_training_noise

    torch.set_num_threads(1)
    cfg = compose_config(["+experiment=sac_pendulum", "training.use_amp=false"])
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    batch_size = cfg.training.batch_size or policy_cfg.batch_size

    # SB3 on Pendulum, its buffer filled by `learn` (100 random transitions, then one update per transition).
    sb3 = SAC("MlpPolicy", gym.make("Pendulum-v1"), learning_starts=100, seed=0, device="cpu", verbose=0)
    sb3.learn(2_000)
    # Ours: 2,000 random transitions collected by the trainer's collector into the trainer's replay buffer.
    env_cfg = env_config(cfg)
    buffer = ReplayBuffer(10_000, 1, seed=0)
    schedule = UpdateSchedule(n_envs=1, train_freq=2_000, learning_starts=2_000)
    collector = Collector(env_cfg, 1, False, make_policy(policy_cfg), buffer, schedule, torch.device("cpu"))
    collector.start(0)
    collector.collect(Counts(), lambda: False)
    collector.close()

    def sample(size: int) -> dict[str, torch.Tensor]:
        return sample_mixed(buffer, None, size, 1, 0.0)  # what the trainer samples

    contenders: dict[str, Any] = {}
    for name, amp in (("ours_fp32", "false"), ("ours_bf16", "true")):
        torch.manual_seed(0)
        policy = make_policy(policy_cfg)
        tcfg = copy.deepcopy(cfg.training)
        tcfg.use_amp = amp
        step = TrainStep(policy, policy_cfg, tcfg, total_updates=100_000)

        def update(k: int, step=step, policy=policy) -> None:
            for _ in range(k):
                step(sample(batch_size), where="speed")
                policy.update_target()

        contenders[name] = update
        if name == "ours_fp32":
            flop_policy = policy

    def sb3_update(k: int) -> None:
        sb3.train(gradient_steps=k, batch_size=batch_size)

    contenders["sb3"] = sb3_update
    cpu: dict[str, list[float]] = {k: [] for k in contenders}
    wall: dict[str, list[float]] = {k: [] for k in contenders}
    block = args.block
    for update in contenders.values():
        update(20)
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, update in contenders.items():
            c, w = time.process_time(), time.perf_counter()
            update(block)
            cpu[name].append((time.process_time() - c) / block * 1e3)
            wall[name].append((time.perf_counter() - w) / block * 1e3)

    # FLOPs of one of our updates (forward and backward; the optimizer's elementwise work is not counted).
    flop_policy.train()
    batch = {**sample(batch_size), **shard_training_noise(flop_policy, batch_size)}
    with FlopCounterMode(display=False) as counter:
        flop_policy(batch)["loss"].backward()
    flops = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        sb3.train(gradient_steps=1, batch_size=batch_size)
    sb3_flops = counter.get_total_flops()
    rates = {"float32": matmul_rate(torch.float32), "bfloat16": matmul_rate(torch.bfloat16)}
    result = {
        "machine": common.machine_info(),
        "load_avg_1m_before": load_before,
        "batch_size": batch_size,
        "hidden_dims": list(policy_cfg.hidden_dims),
        "rounds": args.rounds,
        "updates_per_block": block,
        "update_ms_cpu": {k: {"median": statistics.median(v), "min": min(v)} for k, v in cpu.items()},
        "update_ms_wall": {k: {"median": statistics.median(v), "min": min(v)} for k, v in wall.items()},
        "flops_per_update": flops,
        "sb3_flops_per_update": sb3_flops,
        "matmul_gflops_1_thread": rates,
        "floor_ms": {k: flops / (r * 1e9) * 1e3 for k, r in rates.items()},
    }
    sb3_ms = result["update_ms_cpu"]["sb3"]["median"]
    result["sb3_over_ours_cpu"] = {
        k: sb3_ms / v["median"] for k, v in result["update_ms_cpu"].items() if k != "sb3"
    }
    path = RESULTS / "sb3_speed.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", choices=sorted(SUITES), default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["ours", "sb3"])
    parser.add_argument("--envs", nargs="+", help="env configs (default: the suite's)")
    parser.add_argument("--settings", nargs="+", help="NxG: n_envs x gradient_steps, e.g. 1x1 4x2 8x-1")
    parser.add_argument("--steps", type=int, help="transitions per run (default: the suite's)")
    parser.add_argument(
        "--eval-every", type=int, help="transitions between evaluations (default: the suite's)"
    )
    parser.add_argument("--extra", nargs="+", default=[], help="more config overrides for every run")
    parser.add_argument("--results", type=Path, help="results JSON (default: results/sb3_<suite>.json)")
    parser.add_argument("--report", action="store_true", help="write the tables and the plot only")
    parser.add_argument("--speed", action="store_true", help="per-update timing and the floor")
    parser.add_argument("--rounds", type=int, default=12, help="--speed: alternating rounds")
    parser.add_argument("--block", type=int, default=20, help="--speed: updates per timed block")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a sweep's subprocess: one run's spec (JSON)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global RESULTS_OVERRIDE
    RESULTS_OVERRIDE = args.results
    if args.one:
        run_one(json.loads(args.one), Path(args.out))
    elif args.speed:
        speed(args)
    elif args.report:
        report(args)
    else:
        with contextlib.suppress(KeyboardInterrupt):
            sweep(args)


if __name__ == "__main__":
    main()
