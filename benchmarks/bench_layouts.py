"""How far a trained fp32 policy's episodes depend on the evaluation's layout, and what paired noise buys.

    python benchmarks/bench_layouts.py --checkpoint RUN [--other RUN2] [--episodes 100] \
        [--batch-sizes 1 8 50] [--async-batch 8] [--extra NAME=EVAL_DIR ...] [--results layouts]

Part 1: `RUN` is evaluated over the same episodes (same `eval.start_seed`) with every batch size, sync, and
once async; per layout, against the first layout: the share of episodes with the same success and steps,
and with the same max reward too (to 1e-9 and to 1e-3), the largest and median max-reward difference, and
the aggregated figures with their 95% intervals. `--reuse` summarizes the evaluations already in `--out`.
`--extra` adds evaluations made elsewhere (e.g. `torchrun --nproc_per_node 2 scripts/eval.py ...`).
Part 2 (with `--other`): `RUN2 - RUN` paired on initial states and on noise (both evaluations draw each
episode's noise from its own stream, as evaluation does) against paired on initial states only (RUN2
evaluated again with the streams salted, so that its noise is independent of RUN's, as it was before
per-episode streams): the widths of the paired 95% intervals. Writes `benchmarks/results/<--results>.json`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from common import print_table, save_results

from lerobot.checkpoints import load_for_run, locate
from lerobot.cli.compose import checkpoint_config
from lerobot.compare import paired_difference
from lerobot.evaluation import evaluate
from lerobot.policies import acting as policy_module  # where `episode_stream` is looked up

FIGURES = ("avg_max_reward", "avg_max_reward_ci95_low", "avg_max_reward_ci95_high", "pc_success")


def run_eval(checkpoint: Path, out: Path, overrides: list[str]) -> dict:
    """`scripts/eval.py --checkpoint checkpoint` with `overrides`, written to `out`; its eval_info."""
    source = locate(checkpoint)
    cfg = checkpoint_config(source.path, overrides)
    evaluate(cfg, load_for_run(source, cfg), out)
    return json.loads((out / "eval_info.json").read_text())


def agreement(reference: list[dict], other: list[dict]) -> dict:
    """How `other`'s episodes compare with `reference`'s: the share with the same success and steps, the share
    also with the same max reward (to 1e-9, and to 1e-3), and the largest and median max-reward difference."""
    pairs = list(zip(reference, other, strict=True))
    same = np.array([(a["success"], a["n_steps"]) == (b["success"], b["n_steps"]) for a, b in pairs])
    diff = np.array([abs(a["max_reward"] - b["max_reward"]) for a, b in pairs])
    return {
        "same_success_and_steps": float(same.mean()),
        "equal_episodes": float((same & (diff < 1e-9)).mean()),
        "equal_to_1e-3": float((same & (diff < 1e-3)).mean()),
        "max_reward_diff_max": float(diff.max()),
        "max_reward_diff_median": float(np.median(diff)),
    }


def salted_streams(salt: int):
    """An `episode_stream` whose streams differ from the real ones (independent noise, same initial states)."""
    real = policy_module.episode_stream
    return lambda seed: real(seed + salt * 1_000_003)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--other", type=Path, help="a second checkpoint, compared with --checkpoint")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 50])
    parser.add_argument("--async-batch", type=int, default=8)
    parser.add_argument("--extra", nargs="*", default=[], help="NAME=EVAL_DIR evaluations to compare too")
    parser.add_argument("--out", type=Path, help="where the evaluations go (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="summarize the evaluations already in --out")
    parser.add_argument("--results", default="layouts", help="results/<name>.json to write")
    args = parser.parse_args(argv)
    if args.reuse and args.out is None:
        parser.error("--reuse needs --out")
    out = args.out or Path(tempfile.mkdtemp(prefix="layouts-"))
    common = [f"eval.n_episodes={args.episodes}", "eval.max_episodes_rendered=0"]
    layouts = {
        f"batch {b} sync": [f"eval.batch_size={b}", "eval.use_async_envs=false"] for b in args.batch_sizes
    }
    layouts[f"batch {args.async_batch} async"] = [
        f"eval.batch_size={args.async_batch}",
        "eval.use_async_envs=true",
    ]
    infos = {}
    for i, (name, overrides) in enumerate(layouts.items()):
        if not args.reuse:
            run_eval(args.checkpoint, out / f"layout{i}", [*common, *overrides])
        infos[name] = json.loads((out / f"layout{i}" / "eval_info.json").read_text())
    for item in args.extra:
        name, path = item.split("=", 1)
        infos[name] = json.loads((Path(path) / "eval_info.json").read_text())
    reference = next(iter(infos.values()))["per_episode"]
    rows = [
        {
            "layout": name,
            **agreement(reference, info["per_episode"]),
            **{k: info["aggregated"][k] for k in FIGURES},
        }
        for name, info in infos.items()
    ]
    print_table(rows, list(rows[0]))
    extra = {"args": {k: str(v) for k, v in vars(args).items()}, "out": str(out)}
    if args.other is not None:
        layout = [*common, f"eval.batch_size={max(args.batch_sizes)}", "eval.use_async_envs=false"]
        base_dir = out / f"layout{list(layouts).index(f'batch {max(args.batch_sizes)} sync')}"
        if not args.reuse:
            run_eval(args.other, out / "other_paired", layout)
            real = policy_module.episode_stream
            policy_module.episode_stream = salted_streams(1)
            try:
                run_eval(args.other, out / "other_independent", layout)
            finally:
                policy_module.episode_stream = real
        paired = {}
        for name in ("other_paired", "other_independent"):
            r = paired_difference([(base_dir, out / name)])
            paired[name] = {
                "delta_avg_max_reward": r["delta_avg_max_reward"],
                "half_width_avg_max_reward": (
                    r["delta_avg_max_reward_ci_high"] - r["delta_avg_max_reward_ci_low"]
                )
                / 2,
                "delta_pc_success": r["delta_pc_success"],
                "half_width_pc_success": (r["delta_pc_success_ci_high"] - r["delta_pc_success_ci_low"]) / 2,
            }
        print(json.dumps(paired, indent=1))
        extra["paired_noise"] = paired
    print(save_results(args.results, rows, extra))


if __name__ == "__main__":
    main()
