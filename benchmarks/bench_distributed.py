"""Data-parallel training speed: samples/s at N processes and the cost of averaging the gradients.

    cd benchmarks && python bench_distributed.py [--steps 30] [--rows dp_keypoints_cpu]        # 1 process
    cd benchmarks && torchrun --nproc_per_node 2 bench_distributed.py [--steps 30]            # 2 processes

Each row is one training step exactly as the offline trainer runs it on N processes: this process's slice
of the global batch from the real loader (`cycle_batches(shard=...)`), then `TrainStep` (this process's
rows of the global batch's random draws, forward through DDP, the loss weighed by its share of the real
actions, backward with DDP's gradient all-reduce, clipping, AdamW, EMA); the global batch
is the config's (64 for the CPU experiment), whatever N is. Reported (medians over `--steps` after 3
warm-up steps, timed on the main process): step time and global samples/s; and `allreduce_ms`, an
all-reduce of one fp32 buffer the size of the gradients, timed alone (what DDP adds per step when nothing
overlaps it; 0 on one process). Rows are kept per (row, nproc) in results/distributed.json.
"""

from __future__ import annotations

# isort: off
import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# isort: on
import argparse
import statistics
import time
from pathlib import Path

import torch
from common import keep_previous_rows, print_table, save_results

from lerobot import distributed
from lerobot.cli import compose_config
from lerobot.config import env_config
from lerobot.datasets import cycle_batches, import_dataset, make_dataset
from lerobot.policy_registry import make_policy_config
from lerobot.training.offline import make_offline_policy
from lerobot.training.update import TrainStep

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = {"dp_keypoints_cpu": ["+experiment=diffusion_pusht_keypoints_cpu"]}
WARMUP = 3


def _allreduce_ms(numel: int, repeats: int) -> float:
    """Median time of one all-reduce of `numel` fp32 values over all processes (0 on one)."""
    if not distributed.active():
        return 0.0
    buffer = torch.zeros(numel)
    times = []
    for _ in range(repeats):
        distributed.barrier()
        t0 = time.perf_counter()
        torch.distributed.all_reduce(buffer)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_row(name: str, overrides: list[str], steps: int, data_root: str | None) -> dict:
    cfg = compose_config([*overrides, *([f"dataset.root={data_root}"] if data_root else [])])
    env_cfg = env_config(cfg)
    policy_cfg = make_policy_config(cfg.policy, env_cfg)
    batch_size = cfg.training.batch_size or policy_cfg.batch_size
    local = distributed.shard_size(batch_size)
    device = distributed.init(torch.device("cpu"))
    distributed.on_main(lambda: import_dataset(cfg.dataset))  # converts the data once
    dataset = make_dataset(cfg.dataset, env_cfg, policy_cfg.delta_timestamps(env_cfg.fps), split="train")
    torch.manual_seed(0)
    policy = make_offline_policy(policy_cfg, dataset, device)
    n_params = sum(p.numel() for p in policy.parameters())
    update = TrainStep(policy, policy_cfg, cfg.training, total_updates=1000)
    batches = cycle_batches(dataset, batch_size, seed=0, shard=(distributed.rank(), distributed.world_size()))
    data_s, step_s = [], []
    for i in range(WARMUP + steps):
        distributed.barrier()
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        update(batch, where="benchmark step")
        t2 = time.perf_counter()
        if i >= WARMUP:
            data_s.append(t1 - t0)
            step_s.append(t2 - t0)
    step = statistics.median(step_s)
    return {
        "row": name,
        "nproc": distributed.world_size(),
        "params_M": n_params / 1e6,
        "global_batch": batch_size,
        "local_batch": local,
        "torch_threads": torch.get_num_threads(),
        "data_ms": 1e3 * statistics.median(data_s),
        "step_ms": 1e3 * step,
        "samples_per_s": batch_size / step,
        "grad_MB": 4 * n_params / 1e6,
        "allreduce_ms": _allreduce_ms(n_params, repeats=max(steps, 10)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    shared = REPO_ROOT.parent / "shared" / "data" / "pusht"
    parser.add_argument("--data-root", default=str(shared) if shared.is_dir() else None)
    args = parser.parse_args(argv)
    rows = [run_row(name, ROWS[name], args.steps, args.data_root) for name in args.rows]
    if distributed.is_main():
        columns = ["row", "nproc", "local_batch", "torch_threads", "data_ms", "step_ms", "samples_per_s"]
        print_table(rows, [*columns, "grad_MB", "allreduce_ms"])
        for row in rows:
            row["key"] = f"{row['row']}@{row['nproc']}"
        path = save_results("distributed", keep_previous_rows("distributed", rows, key="key"))
        print(f"wrote {path}")
    distributed.barrier()
    distributed.shutdown()


if __name__ == "__main__":
    main()
