"""What per-episode random streams cost Diffusion Policy's chunks: one generator per batch row against one
for the whole batch, at batch 1, 8 and 50.

    python benchmarks/bench_streams.py [--models image keypoints] [--batch-sizes 1 8 50] [--repeats 5]

Per model and batch size: the median time of a whole chunk (DDIM 10, fp32, the paper-size models with
random weights) drawing its noise from one generator and from B episode streams (`Policy.noise_generators`,
what evaluation uses), measured alternately in one run; and the noise draw alone both ways plus the cost of
making the B streams (once per episode, `episode_stream`). Writes `benchmarks/results/streams.json`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_inference import build_policies, observations
from common import print_table, save_results
from diffusers.utils.torch_utils import randn_tensor

from lerobot.policies.policy import episode_stream

MODELS = {"image": "pusht", "keypoints": "pusht_keypoints"}


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def measure(model: str, batch: int, repeats: int) -> dict:
    """One row: chunk and noise-draw medians (ms) with one generator and with `batch` episode streams."""
    policy = build_policies(MODELS[model], ["fp32 eager"])["fp32 eager"]
    policy.config.inference_scheduler, policy.config.num_inference_steps = "DDIM", 10
    obs = observations(policy, batch)
    shape = (batch, policy.config.horizon, policy.config.action_dim)
    seeds = range(100_000, 100_000 + batch)
    one_ms, rows_ms, draw_one_us, draw_rows_us, make_us = [], [], [], [], []
    policy.predict_action_chunk(obs, torch.Generator().manual_seed(0))  # warm-up
    streams = [episode_stream(s) for s in seeds]
    generator = torch.Generator().manual_seed(0)
    for _ in range(repeats):  # alternating, so that both see the same machine
        one_ms.append(_ms(lambda: policy.predict_action_chunk(obs, generator)))
        rows_ms.append(_ms(lambda: policy.predict_action_chunk(obs, streams)))
        make_us.append(1e3 * _ms(lambda: [episode_stream(s) for s in seeds]))
        draw_one_us.append(1e3 * _ms(lambda: randn_tensor(shape, generator=generator, dtype=torch.float32)))
        draw_rows_us.append(1e3 * _ms(lambda: randn_tensor(shape, generator=streams, dtype=torch.float32)))
    chunk_one, chunk_rows = statistics.median(one_ms), statistics.median(rows_ms)
    draw_extra_us = statistics.median(draw_rows_us) - statistics.median(draw_one_us)
    return {
        "model": model,
        "batch": batch,
        "chunk_ms_one_generator": chunk_one,
        "chunk_ms_episode_streams": chunk_rows,
        "noise_us_one_generator": statistics.median(draw_one_us),
        "noise_us_episode_streams": statistics.median(draw_rows_us),
        "streams_make_us": statistics.median(make_us),
        "extra_fraction_of_chunk": draw_extra_us / (1e3 * chunk_one),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 50])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(m, b, args.repeats) for m in args.models for b in args.batch_sizes]
    print_table(rows, list(rows[0]))
    print(save_results("streams", rows, {"args": vars(args)}))


if __name__ == "__main__":
    main()
