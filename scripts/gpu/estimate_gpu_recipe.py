"""Expected wall time of a GPU recipe, estimated from one training step measured on any machine.

    python scripts/gpu/estimate_gpu_recipe.py [--experiment diffusion_pusht_gpu] [--data-root DIR]

Counts, for one full training step of the experiment's config (the trainers' `TrainStep`: forward,
backward, clipping, AdamW, EMA) on a real batch: the FLOPs of its matmuls and convolutions
(`torch.utils.flop_counter.FlopCounterMode`) and the number of ATen operators it dispatches (each is at
least one GPU kernel launch). These counts do not depend on the machine. On a GPU, the step's device time
is its matmul/convolution FLOPs at an assumed fraction of the peak bf16 throughput plus the memory traffic
of the per-parameter updates at an assumed fraction of the memory bandwidth (AdamW reads parameter,
gradient and both moments and writes three of them, the EMA reads two and writes one, clipping reads the
gradient: about 44 bytes per fp32 parameter); the host time is the operators times an assumed per-kernel
dispatch cost (eager mode, no CUDA graph). The GPU runs behind the host, so a step takes the larger of the
two. Peak throughput and bandwidth are the vendors' specifications (dense bf16, no sparsity); utilization,
efficiency and dispatch cost are assumptions, given as an optimistic and a pessimistic set and saved with
the results. Every figure this script prints is an estimate, not a measurement. Writes
benchmarks/results/gpu_recipe.json.
"""

from __future__ import annotations

# isort: off
import sys
from pathlib import Path

import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# The benchmark helpers it shares (bench_train, common) live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
# isort: on
import argparse
from collections import Counter

from bench_train import default_data_root, diffusion_training
from common import machine_info, print_table, save_results
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# Vendor specifications: peak dense bf16 tensor-core TFLOP/s and memory bandwidth in TB/s.
GPUS = {
    "H200 SXM": (989.0, 4.8),
    "H100 SXM": (989.0, 3.35),
    "A100 80GB SXM": (312.0, 2.04),
    "L40S": (362.0, 0.864),
    "RTX 4090": (165.0, 1.008),
    "L4": (121.0, 0.3),
}
# Bytes of optimizer, EMA and clipping traffic per fp32 parameter and step (see the module docstring).
UPDATE_BYTES_PER_PARAM = 44
# Assumptions, as (optimistic, pessimistic): fraction of peak FLOP/s reached by this model's matmuls and
# convolutions, fraction of the memory bandwidth reached by the updates, host cost per dispatched operator.
ASSUMPTIONS = {"utilization": (0.4, 0.2), "bandwidth_efficiency": (0.8, 0.5), "dispatch_us": (5.0, 15.0)}


class _CountOps(TorchDispatchMode):
    """Counts the ATen operators dispatched while active."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_step(overrides: list[str]) -> dict:
    """FLOPs and dispatched operators of one training step of the composed config, plus its schedule."""
    cfg, policy, update, batches, batch_size = diffusion_training(overrides)  # as the trainer builds them
    batch = next(batches)
    update(batch, where="warm-up step")  # optimizer state exists from here on, as in every later step
    flops, ops = FlopCounterMode(display=False), _CountOps()
    with flops, ops:
        update(batch, where="counted step")
    return {
        "params_M": sum(p.numel() for p in policy.parameters()) / 1e6,
        "batch": batch_size,
        "steps": cfg.training.steps,
        "gflop_per_step": flops.get_total_flops() / 1e9,
        "ops_per_step": sum(ops.counts.values()),
    }


def estimate(step: dict) -> list[dict]:
    """Per GPU type, optimistic ("fast") and pessimistic ("slow"): step time, what bounds it, and the
    recipe's training wall time in hours (evaluation not included)."""
    update_gb = step["params_M"] * 1e6 * UPDATE_BYTES_PER_PARAM / 1e9
    rows = []
    for gpu, (peak_tflops, bandwidth_tbs) in GPUS.items():
        row = {"gpu": gpu, "peak_bf16_tflops": peak_tflops, "bandwidth_tbs": bandwidth_tbs}
        for i, label in enumerate(("fast", "slow")):
            util, eff, dispatch_us = (ASSUMPTIONS[k][i] for k in ASSUMPTIONS)
            device_ms = step["gflop_per_step"] / (peak_tflops * util) + update_gb / (bandwidth_tbs * eff)
            host_ms = step["ops_per_step"] * dispatch_us / 1e3
            row[f"step_ms_{label}"] = max(device_ms, host_ms)
            row[f"bound_{label}"] = "device" if device_ms >= host_ms else "host dispatch"
            row[f"hours_{label}"] = row[f"step_ms_{label}"] * step["steps"] / 3.6e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="diffusion_pusht_gpu")
    parser.add_argument("--data-root", default=default_data_root(), help="directory with the PushT zarr")
    args = parser.parse_args(argv)
    overrides = [f"+experiment={args.experiment}"]
    if args.data_root:
        overrides.append(f"dataset.root={args.data_root}")
    step = count_step(overrides)
    print(step)
    # The counts above are this machine's measurement; everything below is arithmetic on them.
    rows = estimate(step)
    print_table(
        rows, ["gpu", "step_ms_fast", "bound_fast", "hours_fast", "step_ms_slow", "bound_slow", "hours_slow"]
    )
    assumptions = {**ASSUMPTIONS, "update_bytes_per_param": UPDATE_BYTES_PER_PARAM}
    path = save_results(
        "gpu_recipe", rows, {"experiment": args.experiment, "step": step, "assumptions": assumptions}
    )
    print(f"wrote {path}; machine: {machine_info()}")


if __name__ == "__main__":
    main()
