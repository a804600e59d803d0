"""Training step speed: ms per step, samples/s, data time vs compute time, achieved GFLOP/s; fp32 vs bf16
autocast, eager vs compiled.

    cd benchmarks && python bench_train.py [--steps 4] [--rows dp_image dp_image_cpu ...]
                                           [--variants fp32 "bf16 autocast" "fp32 compiled" "bf16 compiled"]
                                           [--overrides KEY=VALUE ...] [--threads 2] [--data-root DIR]
                                           [--results train]

Rows (each step exactly as the trainers do it):
- `dp_image`: Diffusion Policy, `policy=diffusion env=pusht` (paper size, ~263M parameters), batch 64.
- `dp_keypoints`: `env=pusht_keypoints` (paper's low-dimensional U-Net, ~64M), batch 256.
- `dp_keypoints_cpu`: the recorded CPU experiment (`+experiment=diffusion_pusht_keypoints_cpu`: U-Net
  64/128/256, batch 64), the configuration of the README's learning result.
- `dp_image_cpu`: the CPU image experiment (`+experiment=diffusion_pusht_image_cpu`: images resized to
  48x48 and cropped to 44x44, three ResNet-18 stages, U-Net 64/128/256, batch 64).
- `tdmpc`: one TD-MPC update (`policy=tdmpc env=pusht_keypoints`, batch 256, horizon 5) on the PushT
  demonstrations loaded into its replay buffer, as the online trainer's offline buffer holds them.
- `tdmpc_cpu`: the same for the CPU experiment (`+experiment=tdmpc_pusht_keypoints_cpu`: 256-wide MLPs,
  batch 128).

Diffusion Policy: data = `next()` on the real loader (`make_dataset` + `cycle_batches`, num_workers 0, as
the CPU experiment trains); compute = the trainers' `TrainStep` (forward under bf16 autocast or not,
backward, grad clipping, AdamW, LR schedule, EMA). TD-MPC: data = `ReplayBuffer.sample`, compute =
`TrainStep` + `update_target()` (the target network's EMA). The variants' steps (default fp32 and bf16
autocast; "compiled" runs the forward pass through `torch.compile`, as `training.compile=true` does) alternate
on the same model (one warm-up step each, excluded; a compiled variant's compiles), so load drift hits all
alike; medians over `--steps`, and each variant's speed-up against the first one listed. `--overrides` change
every row's config (e.g. `policy.vision_backbone_stages=3`).
FLOPs: `torch.utils.flop_counter.FlopCounterMode` over one forward + backward (matmuls and convolutions;
the optimizer's elementwise work is not counted). Writes results/<--results>.json (default train).
"""

from __future__ import annotations

# isort: off
import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# isort: on
import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from common import keep_previous_rows, machine_info, print_table, save_results
from omegaconf import DictConfig
from torch.utils.flop_counter import FlopCounterMode

from lerobot.cli import compose_config
from lerobot.config import env_config
from lerobot.datasets import cycle_batches, make_dataset
from lerobot.policies.policy import Policy
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training.update import TrainStep

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = {
    "dp_image": ["policy=diffusion", "env=pusht"],
    "dp_keypoints": ["policy=diffusion", "env=pusht_keypoints"],
    "dp_keypoints_cpu": ["+experiment=diffusion_pusht_keypoints_cpu"],
    "dp_image_cpu": ["+experiment=diffusion_pusht_image_cpu"],
    "tdmpc": ["policy=tdmpc", "env=pusht_keypoints"],
    "tdmpc_cpu": ["+experiment=tdmpc_pusht_keypoints_cpu"],
}
# Each variant: (bf16 autocast, torch.compile of the forward pass as `training.compile` does it).
VARIANTS = {
    "fp32": (False, False),
    "bf16 autocast": (True, False),
    "fp32 compiled": (False, True),
    "bf16 compiled": (True, True),
}


def default_data_root() -> str | None:
    """The PushT demonstrations beside the checkout, where they exist."""
    shared = REPO_ROOT.parent / "shared" / "data" / "pusht"
    return str(shared) if shared.is_dir() else None


def _variant_updater(update: TrainStep, variants: list[str]):
    """A function `(batch, variant)` that makes the trainers' gradient update of `variant`: the same model,
    optimizer and EMA for every variant, under bf16 autocast or not, through the eager or the compiled
    forward pass (compiled once, at its first step, only when a compiled variant is asked for)."""
    models = {False: update.model}
    if any(VARIANTS[v][1] for v in variants):
        models[True] = torch.compile(update.model)

    def run(batch: dict, variant: str) -> None:
        update.use_amp, compiled = VARIANTS[variant]
        update.model = models[compiled]
        update(batch, where="benchmark step")

    return run


def _flops(policy, batch: dict) -> float:
    """FLOPs of one fp32 forward + backward on `batch`."""
    counter = FlopCounterMode(display=False)
    with counter:
        policy.forward(batch)["loss"].backward()
    policy.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def diffusion_training(overrides: list[str]) -> tuple[DictConfig, Policy, TrainStep, Iterator[dict], int]:
    """The composed config, a seeded Diffusion policy, the trainers' `TrainStep` for it, the real loader's
    batches (`num_workers=0`) and the batch size, as the offline trainer builds them."""
    cfg = compose_config(overrides)
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    batch_size = cfg.training.batch_size or policy_cfg.batch_size
    dataset = make_dataset(cfg.dataset, env_cfg, policy_cfg.delta_timestamps(env_cfg.fps), split="train")
    torch.manual_seed(0)
    policy = make_policy(policy_cfg, dataset_stats=dataset.stats).train()
    update = TrainStep(policy, policy_cfg, cfg.training, total_updates=cfg.training.steps)
    batches = cycle_batches(dataset, batch_size=batch_size, seed=0, num_workers=0)
    return cfg, policy, update, batches, batch_size


def diffusion_row(name: str, overrides: list[str], steps: int, variants: list[str]) -> list[dict]:
    _, policy, update, batches, batch_size = diffusion_training(overrides)
    n_params = sum(p.numel() for p in policy.parameters())
    run = _variant_updater(update, variants)

    def step(variant: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        run(batch, variant)
        return t1 - t0, time.perf_counter() - t1

    flops = _flops(policy, next(batches))
    return _time_rows(name, n_params, batch_size, flops, step, steps, variants)


def tdmpc_row(name: str, overrides: list[str], steps: int, variants: list[str]) -> list[dict]:
    from lerobot.training.demonstrations import load_demonstrations

    cfg = compose_config(overrides)
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    torch.manual_seed(0)
    policy = make_policy(policy_cfg).train()
    n_params = sum(p.numel() for p in policy.parameters())
    update = TrainStep(policy, policy_cfg, cfg.training, total_updates=1000)
    buffer = load_demonstrations(cfg, env_cfg, list(policy.obs_keys))
    batch_size, horizon = cfg.training.batch_size or policy_cfg.batch_size, policy.replay_horizon
    run = _variant_updater(update, variants)

    def step(variant: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        batch = buffer.sample(batch_size, horizon)
        t1 = time.perf_counter()
        run(batch, variant)
        policy.update_target()
        return t1 - t0, time.perf_counter() - t1

    flops = _flops(policy, buffer.sample(batch_size, horizon))
    return _time_rows(name, n_params, batch_size, flops, step, steps, variants)


def _time_rows(name, n_params, batch_size, flops, step, steps, variants) -> list[dict]:
    data = {d: [] for d in variants}
    compute = {d: [] for d in variants}
    errors = {}
    for i in range(steps + 1):
        for variant in variants:
            if variant in errors:
                continue
            try:
                d, c = step(variant)
            except RuntimeError as e:  # e.g. a policy whose forward does not run under autocast
                errors[variant] = str(e).splitlines()[0]
                print(f"{name} {variant}: failed, row skipped: {errors[variant]}")
                continue
            if i:  # the first step of each variant warms up (allocator, autocast, optimizer state, compile)
                data[variant].append(d)
                compute[variant].append(c)
    rows = []
    for variant in variants:
        if variant in errors:
            rows.append({"row": name, "batch": batch_size, "dtype": variant, "error": errors[variant]})
            continue
        data_ms = 1e3 * statistics.median(data[variant])
        compute_ms = 1e3 * statistics.median(compute[variant])
        step_ms = data_ms + compute_ms
        rows.append(
            {
                "row": name,
                "params_M": n_params / 1e6,
                "batch": batch_size,
                "dtype": variant,
                "step_ms": step_ms,
                "data_ms": data_ms,
                "compute_ms": compute_ms,
                "data_pct": 100 * data_ms / step_ms,
                "samples_per_s": batch_size / (step_ms / 1e3),
                "gflop_per_step": flops / 1e9,
                "gflops_per_s": flops / (compute_ms / 1e3) / 1e9,
                "compute_runs_ms": [1e3 * c for c in compute[variant]],
            }
        )
    for row in rows:
        if "compute_ms" in row and "compute_ms" in rows[0]:
            row["speedup_vs_first"] = rows[0]["compute_ms"] / row["compute_ms"]
    print_table(
        rows,
        [
            "row",
            "batch",
            "dtype",
            "step_ms",
            "data_ms",
            "compute_ms",
            "data_pct",
            "samples_per_s",
            "gflops_per_s",
        ],
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per variant (after one warm-up)")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["fp32", "bf16 autocast"],
        choices=list(VARIANTS),
        help="how each step runs; the variants alternate step by step on one model",
    )
    parser.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        help="Hydra overrides added to every row (e.g. policy.down_dims=[...])",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=default_data_root(), help="directory with the PushT zarr")
    parser.add_argument("--results", default="train", help="results/<name>.json to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    extra = [f"dataset.root={args.data_root}"] if args.data_root else []

    rows = []
    for name in args.rows:
        print(f"\n{name}:")
        runner = tdmpc_row if name.startswith("tdmpc") else diffusion_row
        rows += runner(name, ROWS[name] + extra + args.overrides, args.steps, args.variants)
    path = save_results(args.results, keep_previous_rows(args.results, rows, key="row"), {"args": vars(args)})
    print("\nsummary:")
    print_table(
        rows,
        [
            "row",
            "params_M",
            "batch",
            "dtype",
            "step_ms",
            "data_pct",
            "samples_per_s",
            "gflops_per_s",
            "speedup_vs_first",
        ],
    )
    print(f"wrote {path}; machine: {machine_info()}")


if __name__ == "__main__":
    main()
