"""What bf16 costs on this CPU against float32: a matmul, and a Linear and a Conv2d under bf16 autocast.

    cd benchmarks && python bench_bf16.py [--threads 2] [--repeats 5]

On a CPU whose oneDNN has bf16 kernels (AVX-512, AMX) bf16 is the fast path that `training.use_amp` and
`inference.dtype=bfloat16` take; on one with AVX2 alone it is emulated, and those settings warn at start-up
(`lerobot.distributed.native_bf16`). Sizes are those of the CPU recipes' layers (a 1024-wide Linear over 256
rows, a 64-channel 3x3 Conv2d over 16 maps of 24x24) and a square matmul small enough to finish where bf16
is emulated. Writes results/bf16_<cpu vendor>.json.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_peer import cpu_vendor
from common import machine_info, print_table, save_results
from torch import nn

from lerobot.distributed import native_bf16


def best_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn`, after one untimed call, in ms."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def autocast_ms(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """`best_ms` of `module(x)` under CPU bf16 autocast."""

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            module(x)

    return best_ms(call, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=512)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.matmul_n
    a, b = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a.bfloat16(), b.bfloat16()
    linear, x_linear = nn.Linear(1024, 1024), torch.randn(256, 1024)
    conv, x_conv = nn.Conv2d(64, 64, 3, padding=1), torch.randn(16, 64, 24, 24)
    with torch.no_grad():
        rows = [
            {"op": f"matmul {n}x{n}", "fp32_ms": best_ms(lambda: a @ b, args.repeats),
             "bf16_ms": best_ms(lambda: a16 @ b16, args.repeats)},
            {"op": "Linear 1024, 256 rows", "fp32_ms": best_ms(lambda: linear(x_linear), args.repeats),
             "bf16_ms": autocast_ms(linear, x_linear, args.repeats)},
            {"op": "Conv2d 64 3x3, 16x24x24", "fp32_ms": best_ms(lambda: conv(x_conv), args.repeats),
             "bf16_ms": autocast_ms(conv, x_conv, args.repeats)},
        ]  # fmt: skip
    for row in rows:
        row["bf16_over_fp32"] = row["bf16_ms"] / row["fp32_ms"]
    rows[0]["fp32_gflops"] = 2 * n**3 / rows[0]["fp32_ms"] / 1e6
    rows[0]["bf16_gflops"] = 2 * n**3 / rows[0]["bf16_ms"] / 1e6
    native = native_bf16(torch.device("cpu"))
    print(f"native bf16 kernels: {native}")
    print_table(rows, ["op", "fp32_ms", "bf16_ms", "bf16_over_fp32"])
    name = f"bf16_{cpu_vendor(machine_info()['cpu'])}"
    extra = {"native_bf16": native, "threads": args.threads, "repeats": args.repeats}
    print(f"wrote {save_results(name, rows, extra)}")


if __name__ == "__main__":
    main()
