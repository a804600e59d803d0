"""Multi-task MetaWorld evaluation side by side with LeRobot's `lerobot-eval`: one LeRobot ACT checkpoint.

    bash benchmarks/setup_lerobot_peer.sh          # once: LeRobot 0.6.1 + its MetaWorld at $LEROBOT_VENV
    python benchmarks/bench_lerobot_eval_metaworld.py [--suites mt10 mt50] [--episodes 2] [--batch-size 2] \
        [--episode-steps 10] [--peer-python $LEROBOT_VENV/bin/python]

1. LeRobot 0.6.1 itself (its Python, `$LEROBOT_VENV/bin/python`, default <repo>/lerobot-venv) builds an
   `ACTPolicy` with LeRobot's default ACT config for the features of LeRobot's MetaWorld env (`corner2`
   camera 3x480x480 as `observation.image`, the 4-dim agent state, a 4-dim action; random weights, no
   pretrained backbone) and saves it as its training does (`save_pretrained` of the policy and of its pre-
   and post-processors, statistics made up: ImageNet's for the camera).
2. Per suite, LeRobot first, then this project:
   - `lerobot-eval --policy.path=<ckpt> --env.type=metaworld --env.task=<tasks> --eval.n_episodes=E
     --eval.batch_size=B --seed=100000` (LeRobot's defaults otherwise: async envs, videos). LeRobot's
     MetaWorld config has no MT10 or MT50 set: MT10 is its ten task names, MT50 its four difficulty groups
     `easy,medium,hard,very_hard` (28 + 11 + 6 + 5 = the 50 tasks).
   - `python scripts/eval.py --checkpoint <ckpt> --config-dir <dir> env=metaworld_pixels_480 env.task=mtNN
     eval.n_episodes=E eval.batch_size=B` (this project's defaults otherwise). `metaworld_pixels_480` is
     `configs/env/metaworld_pixels.yaml` at 480x480 without the task-index feature, written by this script:
     a LeRobot checkpoint has no task input, and `--checkpoint` asks an env for exactly the policy's features.
   With `--episode-steps N` every episode stops after N steps on both sides: ours with
   `env.max_episode_steps=N`; LeRobot's MetaWorld env fixes 500 (`_max_episode_steps`, no option), so
   `lerobot-eval` runs in a wrapper (`lerobot-eval-capped`, a sub-command of this file under LeRobot's Python)
   that sets that attribute to N in a subclass of LeRobot's env before calling LeRobot's own `main()`.
   Both use MUJOCO_GL=egl (LeRobot sets none; gymnasium's default, glfw, needs a display).
3. Each command is one process tree timed from start to exit; a thread samples the RSS of all its processes
   together (the process and every descendant: env workers, forkserver) every 0.2 s, keeping the peak sum and
   the peak process count. Each side's eval_info.json says whether every task ran all its episodes.

`--ours-extra OVERRIDE... --tag NAME` adds rows of this project's side with more overrides (e.g. LeRobot's
rendering work: `env.gym_kwargs.fast_render=false env.gym_kwargs.render_size=480
eval.max_episodes_rendered=20`), keeping the rows of other tags measured with the same settings.

Writes benchmarks/results/lerobot_eval_metaworld.json (outputs under outputs/bench_lerobot_eval_metaworld/).
This file imports nothing from this project at module level: LeRobot's Python runs its sub-commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_ROOT = REPO / "outputs" / "bench_lerobot_eval_metaworld"
RESULT = REPO / "benchmarks" / "results" / "lerobot_eval_metaworld.json"
DEFAULT_PEER_PYTHON = Path(os.environ.get("LEROBOT_VENV", REPO / "lerobot-venv")) / "bin" / "python"
# Metaworld's MT10 (metaworld.env_dict.MT10_V3, this project's `mt10`): LeRobot has no name for it.
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
# LeRobot's MetaWorld difficulty groups (lerobot/envs/metaworld_config.json), together the 50 tasks.
LEROBOT_SUITES = {"mt10": ",".join(MT10), "mt50": "easy,medium,hard,very_hard"}
SUITE_TASKS = {"mt10": 10, "mt50": 50}
ENV_NAME = "metaworld_pixels_480"
SAMPLE_S = 0.2
START_SEED = 100_000


# --------------------------------------------------------------------------- under LeRobot's Python
def _lerobot_imported() -> None:
    """Stop unless `lerobot` is LeRobot's package (this project's has the same top-level name)."""
    import lerobot

    if Path(lerobot.__file__).resolve().is_relative_to(REPO):
        raise SystemExit(
            "this imported the project's own `lerobot`: run with LeRobot's Python, PYTHONPATH unset"
        )


def make_checkpoint(out: Path, seed: int) -> None:
    """LeRobot's default ACT for its MetaWorld env's features, saved as LeRobot's training saves it."""
    _lerobot_imported()
    import torch
    from lerobot.configs.types import FeatureType
    from lerobot.envs.configs import MetaworldEnv
    from lerobot.envs.utils import env_to_policy_features
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.utils.constants import IMAGENET_STATS

    import lerobot

    features = env_to_policy_features(MetaworldEnv(task="reach-v3"))
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    inputs = {k: f for k, f in features.items() if k not in outputs}
    config = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        push_to_hub=False,
        pretrained_backbone_weights=None,
    )
    torch.manual_seed(seed)
    policy = ACTPolicy(config).eval()
    stats = {}
    for key, feature in features.items():
        if feature.type is FeatureType.VISUAL:
            stats[key] = {name: torch.tensor(value) for name, value in IMAGENET_STATS.items()}
            stats[key] |= {"min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
        else:
            dim = feature.shape[0]
            stats[key] = {"mean": torch.zeros(dim), "std": torch.full((dim,), 0.5)}
            stats[key] |= {"min": -torch.ones(dim), "max": torch.ones(dim)}
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    model_dir = out / "pretrained_model"
    model_dir.mkdir(parents=True, exist_ok=True)
    for part in (policy, preprocessor, postprocessor):
        part.save_pretrained(model_dir)
    params = sum(p.numel() for p in policy.parameters())
    shapes = {k: list(f.shape) for k, f in features.items()}
    print(f"wrote {model_dir}: ACT {params / 1e6:.1f}M parameters, {shapes}, lerobot {lerobot.__version__}")


def capped_lerobot_eval(cap: int | None, argv: list[str]) -> None:
    """LeRobot's `lerobot-eval` (its `main()`), its MetaWorld episodes cut at `cap` steps when given.

    LeRobot's `rollout` runs `env.call("_max_episode_steps")` steps at most, and its MetaWorld env sets 500
    in `__init__`. A subclass defined here sets `cap` instead, and LeRobot's `create_metaworld_envs` (which
    `MetaworldEnv.create_envs` imports when called) is replaced by a copy of itself whose env factories build
    the subclass; LeRobot's own class stays in its module. The async env workers get the factories by value
    (cloudpickle: neither the factory nor the subclass is importable), the base class by reference.
    """
    _lerobot_imported()
    import types

    from lerobot.scripts import lerobot_eval

    import lerobot.envs.metaworld as lerobot_metaworld

    if cap is not None:
        base = lerobot_metaworld.MetaworldEnv

        class CappedMetaworldEnv(base):
            def __init__(self, *args, **kwargs):
                base.__init__(self, *args, **kwargs)  # no super(): the class travels by value
                self._max_episode_steps = cap

        original = lerobot_metaworld.create_metaworld_envs
        scope = {**original.__globals__, "MetaworldEnv": CappedMetaworldEnv}
        lerobot_metaworld.create_metaworld_envs = types.FunctionType(
            original.__code__, scope, original.__name__, original.__defaults__, original.__closure__
        )
    sys.argv = ["lerobot-eval", *argv]
    lerobot_eval.main()


# --------------------------------------------------------------------------- this project's side
class TreeSampler:
    """Samples the summed RSS and the number of processes of `pid` and all its descendants."""

    def __init__(self, pid: int, period_s: float = SAMPLE_S):
        import psutil

        self._root = psutil.Process(pid)
        self._period = period_s
        self._stop = threading.Event()
        self.peak_rss = 0
        self.peak_processes = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = 0
        alive = 0
        for proc in procs:
            try:
                rss += proc.memory_info().rss
                alive += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_processes = max(self.peak_processes, alive)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._period)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def busy_neighbours(seconds: float = 1.0, threshold: float = 10.0) -> list[str]:
    """Other processes above `threshold`% of a core over `seconds`: what runs beside a measurement."""
    import psutil

    me = os.getpid()
    procs = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.info["pid"] != me]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)
    time.sleep(seconds)
    busy = []
    for proc in procs:
        try:
            share = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if share > threshold:
            busy.append(f"{share:.0f}% {' '.join(proc.info['cmdline'] or [])[:100]}")
    return busy


def run_measured(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> dict:
    """Run `cmd` to its end (output to `log`), sampling its process tree; wall time, peaks, exit code, the
    load beside it (the 1-minute load average at start and end, the busy processes just before)."""
    beside = busy_neighbours()
    load_start = os.getloadavg()[0]
    with open(log, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        with TreeSampler(proc.pid) as sampler:
            rc = proc.wait()
        wall = time.perf_counter() - start
    return {
        "rc": rc,
        "wall_s": wall,
        "peak_rss_mb": sampler.peak_rss / 2**20,
        "peak_processes": sampler.peak_processes,
        "memory_samples": sampler.samples,
        "load_avg_1m_start": load_start,
        "load_avg_1m_end": os.getloadavg()[0],
        "busy_beside_at_start": beside,
        "log": str(log.relative_to(REPO)),
    }


def peer_env() -> dict[str, str]:
    """The environment for LeRobot's Python: no PYTHONPATH (this repository's `lerobot` stays out)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MUJOCO_GL"] = env.get("MUJOCO_GL", "egl")
    return env


def write_env_config(config_dir: Path) -> None:
    """`<config_dir>/env/metaworld_pixels_480.yaml`: metaworld_pixels with LeRobot's MetaWorld features."""
    import yaml

    cfg = yaml.safe_load((REPO / "configs" / "env" / "metaworld_pixels.yaml").read_text())
    cfg["name"] = ENV_NAME
    cfg["gym_kwargs"].update(width=480, height=480)
    cfg["features"]["observation.image"]["shape"] = [3, 480, 480]
    del cfg["features"]["observation.task_index"]
    del cfg["observation_keys"]["task_index"]
    (config_dir / "env").mkdir(parents=True, exist_ok=True)
    header = "# Written by benchmarks/bench_lerobot_eval_metaworld.py: LeRobot's MetaWorld features.\n"
    (config_dir / "env" / f"{ENV_NAME}.yaml").write_text(header + yaml.safe_dump(cfg, sort_keys=False))


def lerobot_episodes(info_path: Path) -> dict[str, int]:
    """Episodes per task in LeRobot's eval_info.json (`<group>/<task id>` -> count)."""
    info = json.loads(info_path.read_text())
    return {f"{t['task_group']}/{t['task_id']}": len(t["metrics"]["successes"]) for t in info["per_task"]}


def our_episodes(info_path: Path) -> dict[str, int]:
    """Episodes per task in this project's eval_info.json."""
    info = json.loads(info_path.read_text())
    return {task: row["n_episodes"] for task, row in info["aggregated"]["per_task"].items()}


def summarize(side: str, suite: str, run: dict, info_path: Path, args: argparse.Namespace) -> dict:
    """One result row: the measured run plus what its eval_info.json says."""
    row = {"side": side, "suite": suite, **run}
    expected_tasks = SUITE_TASKS[suite]
    if run["rc"] != 0 or not info_path.is_file():
        row.update(all_episodes_ran=False, episodes=0, tasks=0)
        return row
    per_task = (lerobot_episodes if side == "lerobot" else our_episodes)(info_path)
    episodes = sum(per_task.values())
    info = json.loads(info_path.read_text())
    inner = info["overall"]["eval_s"] if side == "lerobot" else info["aggregated"]["eval_s"]
    row.update(
        tasks=len(per_task),
        episodes=episodes,
        all_episodes_ran=len(per_task) == expected_tasks
        and all(n == args.episodes for n in per_task.values()),
        episodes_per_s=episodes / run["wall_s"],
        eval_loop_s=inner,
        eval_loop_episodes_per_s=episodes / inner,
    )
    return row


def kept_rows(new: list[dict], settings: dict) -> list[dict]:
    """The rows of the results file measured with the same `settings` that `new` does not replace (another
    side, suite or tag)."""
    if not RESULT.is_file():
        return []
    old = json.loads(RESULT.read_text())
    if {key: old.get("settings", {}).get(key) for key in settings} != settings:
        return []
    fresh = {(r["side"], r["suite"], r["tag"]) for r in new}
    kept = [{"tag": "", **r} for r in old["rows"]]
    return [r for r in kept if (r["side"], r["suite"], r["tag"]) not in fresh]


def cpu_model() -> str:
    """lscpu's model name (or /proc/cpuinfo's)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", nargs="+", choices=tuple(SUITE_TASKS), default=["mt10", "mt50"])
    parser.add_argument("--episodes", type=int, default=2, help="episodes per task, both sides")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=2,
        help="envs stepped at once, both sides (lerobot-eval lowers it to --episodes when above)",
    )
    parser.add_argument(
        "--episode-steps", type=int, default=10, help="step cap per episode; 0: MetaWorld's 500"
    )
    parser.add_argument("--sides", nargs="+", choices=("lerobot", "ours"), default=["lerobot", "ours"])
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--seed", type=int, default=0, help="the checkpoint's weights")
    parser.add_argument("--note", default="", help="what ran beside it, recorded with the results")
    parser.add_argument(
        "--ours-extra",
        nargs="*",
        default=[],
        metavar="OVERRIDE",
        help="more overrides for this project's side (e.g. env.gym_kwargs.fast_render=false); needs --tag",
    )
    parser.add_argument(
        "--tag",
        default="",
        help="names the rows of this run: rows of other tags (same settings) in the results file are kept",
    )
    args = parser.parse_args(argv)
    if args.batch_size > args.episodes:
        raise SystemExit("--batch-size above --episodes: lerobot-eval would lower it to --episodes")
    if args.ours_extra and not args.tag:
        raise SystemExit("--ours-extra changes this project's side: name the rows with --tag")
    cap = args.episode_steps or None
    OUT_ROOT.mkdir(parents=True, exist_ok=True)
    ckpt = OUT_ROOT / "act_checkpoint"
    have_ckpt = (ckpt / "pretrained_model" / "model.safetensors").is_file()
    if ("lerobot" in args.sides or not have_ckpt) and not args.peer_python.is_file():
        raise SystemExit(
            f"{args.peer_python} not found: run benchmarks/setup_lerobot_peer.sh, set LEROBOT_VENV or "
            "pass --peer-python"
        )
    if not have_ckpt:
        cmd = [str(args.peer_python), str(Path(__file__).resolve()), "make-checkpoint", str(ckpt)]
        subprocess.run([*cmd, "--seed", str(args.seed)], env=peer_env(), cwd="/", check=True)
    config_dir = OUT_ROOT / "configs"
    write_env_config(config_dir)

    ours_env = dict(os.environ)
    ours_env["MUJOCO_GL"] = ours_env.get("MUJOCO_GL", "egl")
    rows = []
    for suite in args.suites:
        for side in args.sides:
            name = f"{side}_{args.tag}_{suite}" if args.tag else f"{side}_{suite}"
            out = OUT_ROOT / name
            if out.exists():
                subprocess.run(["rm", "-rf", str(out)], check=True)
            log = OUT_ROOT / f"{name}.log"
            if side == "lerobot":
                cmd = [str(args.peer_python), str(Path(__file__).resolve()), "lerobot-eval-capped"]
                cmd += ["--cap", str(cap or 0), "--"]
                cmd += [
                    f"--policy.path={ckpt / 'pretrained_model'}",
                    "--env.type=metaworld",
                    f"--env.task={LEROBOT_SUITES[suite]}",
                    f"--eval.n_episodes={args.episodes}",
                    f"--eval.batch_size={args.batch_size}",
                    f"--seed={START_SEED}",
                    f"--output_dir={out}",
                ]
                run = run_measured(cmd, peer_env(), Path("/"), log)
                info = out / "eval_info.json"
            else:
                cmd = [sys.executable, str(REPO / "scripts" / "eval.py"), "--checkpoint", str(ckpt)]
                cmd += ["--config-dir", str(config_dir), f"env={ENV_NAME}", f"env.task={suite}"]
                cmd += [f"eval.n_episodes={args.episodes}", f"eval.batch_size={args.batch_size}"]
                if cap:
                    cmd.append(f"env.max_episode_steps={cap}")
                cmd += [*args.ours_extra, "--output-dir", str(out)]
                run = run_measured(cmd, ours_env, REPO, log)
                info = out / "eval_info.json"
            run["command"] = " ".join(cmd)
            row = {"tag": args.tag, **summarize(side, suite, run, info, args)}
            rows.append(row)
            shown = {k: v for k, v in row.items() if k not in ("command", "log", "busy_beside_at_start")}
            print(json.dumps(shown), flush=True)

    settings = {
        "episodes_per_task": args.episodes,
        "batch_size": args.batch_size,
        "episode_steps": cap or 500,
        "sample_period_s": SAMPLE_S,
        "mujoco_gl": ours_env["MUJOCO_GL"],
    }
    rows = kept_rows(rows, settings) + rows
    ratios = {}
    for peer in (r for r in rows if r["side"] == "lerobot" and r.get("episodes_per_s")):
        for ours in (r for r in rows if r["side"] == "ours" and r["suite"] == peer["suite"]):
            if ours.get("episodes_per_s"):
                ratios[f"{peer['suite']} {ours['tag']}".strip()] = {
                    "episodes_per_s_x": ours["episodes_per_s"] / peer["episodes_per_s"],
                    "eval_loop_x": ours["eval_loop_episodes_per_s"] / peer["eval_loop_episodes_per_s"],
                    "peak_rss_ratio": peer["peak_rss_mb"] / ours["peak_rss_mb"],
                }
    import torch

    result = {
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "python": platform.python_version(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "settings": settings,
        "note": args.note,
        "rows": rows,
        "ours_over_lerobot": ratios,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(RESULT)
    print(json.dumps(ratios, indent=1))
    print(f"wrote {RESULT}")


def peer_main(argv: list[str]) -> None:
    """The sub-commands run by LeRobot's Python."""
    parser = argparse.ArgumentParser(description="sub-commands run under LeRobot's Python")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-checkpoint")
    make.add_argument("out", type=Path)
    make.add_argument("--seed", type=int, default=0)
    capped = sub.add_parser("lerobot-eval-capped")
    capped.add_argument("--cap", type=int, default=0, help="step cap per episode; 0: LeRobot's 500")
    capped.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "make-checkpoint":
        make_checkpoint(args.out, args.seed)
    else:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        capped_lerobot_eval(args.cap or None, rest)


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in ("make-checkpoint", "lerobot-eval-capped"):
        peer_main(sys.argv[1:])
    else:
        main()
