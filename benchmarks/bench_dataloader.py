"""DataLoader throughput on the PushT demonstrations with Diffusion Policy's windows (a benchmark, not a test).

    python benchmarks/bench_dataloader.py [--root DIR] [--workers 0 2] [--passes 5] [--batch-size 64]
    python benchmarks/bench_dataloader.py --repo-id lerobot/pusht [--root LEROBOT_DATASET_DIR]   # imported

Measures full passes (one epoch, batch 64, shuffled, drop_last) over the image training set with
`observation.image`/`observation.state` at offsets [-0.1, 0.0] s and `action` at [-0.1, ..., 1.4] s, once per
worker count, and reports samples/s and ms per batch (best and median of the passes; worker start-up is
included, as in training). What a training step costs next to its batch is `bench_train.py`'s data vs compute
split. Prints a table and writes benchmarks/results/dataloader.json (with --repo-id: dataloader_lerobot.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from lerobot.config import DatasetConfig, EnvConfig  # noqa: E402
from lerobot.constants import DATA_ROOT_ENV  # noqa: E402
from lerobot.datasets import make_dataloader, make_dataset  # noqa: E402

DP_DELTA = {
    "observation.image": [-0.1, 0.0],
    "observation.state": [-0.1, 0.0],
    "action": [round(0.1 * k, 1) for k in range(-1, 15)],
}


def _default_root() -> str | None:
    if os.environ.get(DATA_ROOT_ENV):
        return None  # make_dataset reads the variable itself
    shared = REPO_ROOT.parent / "shared" / "data" / "pusht"
    return str(shared) if shared.is_dir() else None


def _env_cfg() -> EnvConfig:
    merged = OmegaConf.merge(
        OmegaConf.structured(EnvConfig), OmegaConf.load(REPO_ROOT / "configs/env/pusht.yaml")
    )
    return OmegaConf.to_object(merged)


def time_passes(dataset, batch_size: int, num_workers: int, passes: int) -> dict:
    """Time `passes` full DataLoader passes; return samples/s and ms/batch statistics."""
    seconds, samples = [], 0
    for p in range(passes):
        loader = make_dataloader(dataset, batch_size, num_workers=num_workers, seed=p)
        t0 = time.perf_counter()
        samples = 0
        for batch in loader:
            samples += len(batch["index"])
        seconds.append(time.perf_counter() - t0)
    batches = samples // batch_size
    return {
        "num_workers": num_workers,
        "samples_per_pass": samples,
        "batches_per_pass": batches,
        "pass_seconds": seconds,
        "samples_per_s_best": samples / min(seconds),
        "samples_per_s_median": samples / statistics.median(seconds),
        "ms_per_batch_best": 1e3 * min(seconds) / batches,
        "ms_per_batch_median": 1e3 * statistics.median(seconds) / batches,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        default=None,
        help=f"directory with the PushT zarr (default: ${DATA_ROOT_ENV} or ../shared/data/pusht), or with "
        "--repo-id the LeRobotDataset directory (default: the hub cache)",
    )
    parser.add_argument("--repo-id", default=None, help="read a LeRobotDataset (dataset.repo_id) instead")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args(argv)

    env_cfg = _env_cfg()
    t0 = time.perf_counter()
    root = args.root if args.root or args.repo_id else _default_root()
    dataset = make_dataset(DatasetConfig(root=root, repo_id=args.repo_id), env_cfg, DP_DELTA)
    prepare_s = time.perf_counter() - t0
    print(f"dataset ready in {prepare_s:.1f} s: {dataset}")
    load_before = os.getloadavg()[0]
    rows = [time_passes(dataset, args.batch_size, w, args.passes) for w in args.workers]

    print(
        f"\nbatch {args.batch_size}, {rows[0]['samples_per_pass']} samples/pass, best/median of {args.passes} passes"
    )
    print(f"{'workers':>7} | {'samples/s (best)':>16} | {'samples/s (median)':>18} | {'ms/batch (best)':>15}")
    print("-" * 68)
    for r in rows:
        print(
            f"{r['num_workers']:>7} | {r['samples_per_s_best']:>16.0f} | {r['samples_per_s_median']:>18.0f} | "
            f"{r['ms_per_batch_best']:>15.2f}"
        )

    result = {
        "batch_size": args.batch_size,
        "delta_timestamps": DP_DELTA,
        "dataset": {
            "num_frames": dataset.num_frames,
            "num_episodes": dataset.num_episodes,
            "root": str(dataset.root),
        },
        "prepare_seconds": prepare_s,
        "loaders": rows,
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_1min_before": load_before,
            "load_average_1min_after": os.getloadavg()[0],
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    name = "dataloader_lerobot.json" if args.repo_id else "dataloader.json"
    out = REPO_ROOT / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
