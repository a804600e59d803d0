"""Diffusion Policy chunk generation: ms per chunk, FLOPs, achieved GFLOP/s against this CPU's matmul peaks.

    cd benchmarks && python bench_inference.py [--batch-sizes 1 8 50] [--repeats 3] [--models image keypoints]
                                               [--compile-models image] [--threads 2] [--variants ...]

For the paper-size image config (`policy=diffusion env=pusht`, ~263M parameters) and the keypoints config
(`env=pusht_keypoints`, ~64M), with freshly initialized weights and synthetic normalization statistics
(speed does not depend on the values): one `predict_action_chunk` at batch 1, 8, 50 with DDIM 10 steps and
DDPM 100 steps, for fp32 eager (the modules, the default) and each inference option:

- `fp32 eager Conv1d`: the modules with the paper's `nn.Conv1d` / `nn.ConvTranspose1d` layers on the same
  weights (`use_conv1d_layers`), i.e. fp32 eager before our matmul formulation; `speedup_vs_conv1d`
  compares every variant with it,

- `bf16 autocast`: the modules under bf16 autocast (`inference.dtype=bfloat16`),
- `fast fp32` / `fast bf16`: `inference.fast=true` (lerobot/accel/diffusion.py),
- `fast bf16 int8`: plus `inference.int8_weights=true` (int8 weights where a matmul has <= 4 rows),
- `fast bf16 compiled`: plus `inference.compile=true` (its first chunk per batch size compiles; that time
  is reported as `first_chunk_s` and excluded from the medians); for the image model only by default,
- `fast bf16 int8 compiled`: both options.

Every variant runs inside its inference layer, `lerobot.accel.accelerated(policy, <its inference settings>)`
(a fast variant's plan is built once, before the timing).
All variants share one set of weights and run interleaved, round by round, with the same noise seed per
round; `speedup` is the median over rounds of (fp32 eager / variant) within a round, so machine load that
drifts between rounds cancels. DDPM 100 on the image model is not run whole: it is extrapolated from DDPM
chunks of 2 and 10 steps timed in the same rounds, T(100) = T(10) + 90 * (T(10) - T(2)) / 8 (marked
`extrapolated`). Action differences are against fp32 eager with the same noise, in action units (PushT
pixels, range [0, 512]); with untrained weights they show rounding, not task error.

FLOPs per chunk come from `torch.utils.flop_counter.FlopCounterMode` on the fp32 modules (chunks of 1 and 2
steps give the per-step and the fixed part exactly). Peaks: the best of repeated 2048x2048 matmuls in fp32
and bf16 on the same threads, measured at the start, and the rate of reading 1 GiB (a sum), against which
`weight_gb_per_s` (U-Net weight bytes a chunk streams, over its time) is compared: at small batches a
denoising step reads every weight once for little arithmetic, so memory, not the matmul peak, bounds it. Also
an ablation of one U-Net step (image model) and
the torch profiler's top operators of the fp32 step, and (image model, batch <= 8) a steady-state timing
with each variant's DDIM10 chunks run back to back (`steady_state`). Writes results/inference.json (keeping
its `parity` list) and results/inference.png.

    cd benchmarks && python bench_inference.py --parity CHECKPOINT [--parity-runs ...] [--eval-batch 50]

instead evaluates a trained checkpoint under each of `PARITY_RUNS` (success, action differences, chunk
times) and puts the run into the `parity` list of results/inference.json, replacing the entry with the same
`--parity-runs` and `--eval-batch`.
"""

from __future__ import annotations

# isort: off
import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# isort: on

import argparse
import contextlib
import copy
import functools
import json
import os
import statistics
import time
import types
from collections.abc import Iterator
from pathlib import Path

import torch
from common import RESULTS_DIR, load_env, machine_info, print_table, save_results
from omegaconf import DictConfig
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from lerobot.accel import accelerated
from lerobot.accel.diffusion import INT8_MAX_ROWS, InferencePlan, PreparedLinear
from lerobot.config import InferenceConfig
from lerobot.policies.diffusion.modeling import DiffusionPolicy
from lerobot.policies.diffusion.unet import TemporalConv1d, TemporalUpsample1d
from lerobot.policy_registry import make_policy, make_policy_config

MODELS = {"image": "pusht", "keypoints": "pusht_keypoints"}
BASELINE = "fp32 eager"
# Leading columns of the printed timing tables.
TIME_COLUMNS = [
    "model",
    "batch",
    "schedule",
    "variant",
    "ms_per_chunk",
    "speedup",
    "speedup_vs_conv1d",
    "gflops_per_s",
]
# The paper's layers: nn.Conv1d / nn.ConvTranspose1d on the same weights, fp32 eager (see `use_conv1d_layers`).
CONV1D = "fp32 eager Conv1d"
# Variant name -> its `inference` section (`InferenceConfig` fields).
VARIANTS = {
    "fp32 eager": {},
    CONV1D: {},
    "bf16 autocast": {"dtype": "bfloat16"},
    "fast fp32": {"fast": True},
    "fast bf16": {"fast": True, "dtype": "bfloat16"},
    "fast bf16 int8": {"fast": True, "dtype": "bfloat16", "int8_weights": True},
    "fast bf16 compiled": {"fast": True, "dtype": "bfloat16", "compile": True},
    "fast bf16 int8 compiled": {"fast": True, "dtype": "bfloat16", "int8_weights": True, "compile": True},
}


def use_conv1d_layers(policy: DiffusionPolicy) -> DiffusionPolicy:
    """Run this policy's U-Net convolutions as `F.conv1d` / `F.conv_transpose1d` (the paper's formulation,
    what a peer implementation runs) instead of our matmul formulation, same weights and outputs (to fp32
    rounding). Benchmark only: it rebinds `forward` of this policy's layer instances, no other policy's."""

    def conv1d(self: TemporalConv1d, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.view(self.out_features, self.in_channels, self.kernel_size)  # columns (c k)
        return F.conv1d(x, weight, self.bias, self.stride, self.padding)

    for module in policy.unet.modules():
        if isinstance(module, TemporalConv1d):
            module.forward = types.MethodType(conv1d, module)
        elif isinstance(module, TemporalUpsample1d):
            module.forward = types.MethodType(nn.ConvTranspose1d.forward, module)
    return policy


# ----------------------------------------------------------------------------------------------- setup
def synthetic_stats(policy_cfg) -> dict:
    """Normalization statistics from the features' declared bounds (images: mean 0.5, std 0.25; other
    features: their bounds, and the mean and std of a uniform distribution over them)."""
    stats = {}
    for key, feature in {**policy_cfg.input_features, **policy_cfg.output_features}.items():
        if feature.kind == "visual":
            stats[key] = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
        else:
            low, high = torch.as_tensor(feature.low), torch.as_tensor(feature.high)
            stats[key] = {"min": low, "max": high, "mean": (low + high) / 2, "std": (high - low) / 12**0.5}
    return stats


def build_policies(env_name: str, variants: list[str]) -> dict[str, DiffusionPolicy]:
    """One policy per variant, all sharing the first one's weight tensors (`load_state_dict(assign=True)`)."""
    env_cfg = load_env(env_name)
    torch.manual_seed(0)
    policies = {}
    for name in variants:
        # The paper's settings are the defaults of `DiffusionConfig`.
        policy_cfg = make_policy_config({"name": "diffusion"}, env_cfg)
        policy = make_policy(policy_cfg, synthetic_stats(policy_cfg))
        if policies:
            policy.load_state_dict(next(iter(policies.values())).state_dict(), assign=True)
        policies[name] = (use_conv1d_layers(policy) if name == CONV1D else policy).eval()
    return policies


def variant_settings(names: list[str]) -> dict[str, InferenceConfig]:
    """The inference settings of each `VARIANTS` entry in `names`."""
    return {name: InferenceConfig(**VARIANTS[name]) for name in names}


@contextlib.contextmanager
def inference_layers(
    policies: dict[str, DiffusionPolicy], settings: dict[str, InferenceConfig | DictConfig]
) -> Iterator[None]:
    """Every policy inside its inference layer with the settings of the same name: each variant's plan is
    built here, once."""
    with contextlib.ExitStack() as stack:
        for name, policy in policies.items():
            stack.enter_context(accelerated(policy, settings[name]))
        yield


def observations(policy: DiffusionPolicy, batch_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for key, feature in policy.config.input_features.items():
        shape = (batch_size, policy.config.n_obs_steps, *feature.shape)
        scale = 1.0 if feature.kind == "visual" else 512.0
        batch[key] = torch.rand(shape, generator=g) * scale
    return batch


def chunk(
    policy: DiffusionPolicy, obs: dict, scheduler: str, steps: int, seed: int
) -> tuple[float, float, torch.Tensor]:
    """One chunk generation: (wall ms, process CPU ms, actions)."""
    policy.config.inference_scheduler, policy.config.num_inference_steps = scheduler, steps
    generator = torch.Generator().manual_seed(seed)
    c0, t0 = time.process_time(), time.perf_counter()
    actions = policy.predict_action_chunk(obs, generator=generator)
    return 1e3 * (time.perf_counter() - t0), 1e3 * (time.process_time() - c0), actions


# ----------------------------------------------------------------------------------------------- measurements
def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """GB/s of reading a `gib` GiB fp32 tensor (a sum): the rate at which weights stream from memory."""
    data = torch.ones(int(gib * 2**30) // 4)
    data.sum()
    best = min(_seconds(data.sum) for _ in range(repeats))
    return data.numel() * 4 / best / 1e9


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def matmul_peaks(repeats: int = 10, n: int = 2048) -> dict:
    """GFLOP/s of an n x n matmul in fp32 and bf16 (best and median of `repeats`)."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        name = str(dtype).removeprefix("torch.")
        out[f"{name}_best"] = 2 * n**3 / min(times) / 1e9
        out[f"{name}_median"] = 2 * n**3 / statistics.median(times) / 1e9
    return out


def fast_step_weight_bytes(policy: DiffusionPolicy, obs: dict) -> int:
    """Bytes of weights one fast-path U-Net step reads at this batch: each matmul's bf16/fp32 weight, or its
    int8 copy (plus scales) where the call has few enough rows to take it (`INT8_MAX_ROWS`). Inside the
    variant's inference layer, where the plan's U-Net stands in for `policy.unet`."""
    unet = policy.unet
    total = 0

    def count(layer: PreparedLinear, args: tuple) -> None:
        nonlocal total
        if layer.int8_weight is not None and args[0].shape[0] <= INT8_MAX_ROWS:
            tensors = [layer.int8_weight, layer.int8_scale]
        else:
            tensors = [layer.packed if layer.packed is not None else layer.weight]
        total += sum(t.numel() * t.element_size() for t in tensors)

    layers = [m for m in unet.modules() if isinstance(m, PreparedLinear)]
    hooks = [layer.register_forward_pre_hook(count) for layer in layers]
    compiled = unet.compiled  # the same matmuls run eager (a compiled graph skips the hooks)
    unet.__dict__["compiled"] = None
    try:
        chunk(policy, obs, "DDIM", 1, seed=0)
    finally:
        unet.__dict__["compiled"] = compiled
        for hook in hooks:
            hook.remove()
    return total


def count_flops(policy: DiffusionPolicy, obs: dict) -> tuple[float, float]:
    """(fixed FLOPs per chunk (encoder, conditioning), FLOPs per denoising step) of the fp32 modules."""
    totals = []
    for steps in (1, 2):
        counter = FlopCounterMode(display=False)
        with counter:
            chunk(policy, obs, "DDIM", steps, seed=0)
        totals.append(counter.get_total_flops())
    per_step = totals[1] - totals[0]
    return totals[0] - per_step, per_step


def time_batch(policies: dict, model: str, batch: int, repeats: int, ddpm_direct: bool) -> list[dict]:
    obs = observations(next(iter(policies.values())), batch)
    # Compiled variants start from an empty dynamo cache at each batch size, so they run the static graph
    # of this size (as a fixed-batch evaluation does), not the dynamic-batch graph a second size compiles.
    torch._dynamo.reset()
    first = {}
    for name, policy in policies.items():  # warms up, compiles; excluded from the medians
        first[name] = chunk(policy, obs, "DDIM", 2, seed=0)[0] / 1e3
    fixed_flops, step_flops = count_flops(policies[BASELINE], obs)
    fast_step_bytes = {
        name: fast_step_weight_bytes(policy, obs)
        for name, policy in policies.items()
        if VARIANTS[name].get("fast")
    }

    # schedule name -> list of (scheduler, steps) chunks timed per round
    plans = {
        "DDIM10": [("DDIM", 10)],
        "DDPM100": [("DDPM", 100)] if ddpm_direct else [("DDPM", 2), ("DDPM", 10)],
    }
    rows = []
    for schedule, parts in plans.items():
        wall = {n: [] for n in policies}
        cpu = {n: [] for n in policies}
        ratios = {n: [] for n in policies}
        conv1d_ratios = {n: [] for n in policies}
        actions = {}
        for r in range(repeats):
            this_round = {}
            for name, policy in policies.items():
                timings = [chunk(policy, obs, s, k, seed=r) for s, k in parts]
                if len(timings) == 1:
                    ms, cpu_ms = timings[0][:2]
                else:  # T(100) = T(10) + 90 * per-step, per-step = (T(10) - T(2)) / 8
                    (w2, c2, _), (w10, c10, _) = timings
                    ms, cpu_ms = w10 + 90 * (w10 - w2) / 8, c10 + 90 * (c10 - c2) / 8
                if r == 0:
                    actions[name] = timings[-1][2]
                wall[name].append(ms)
                cpu[name].append(cpu_ms)
                this_round[name] = ms
            for name in policies:
                ratios[name].append(this_round[BASELINE] / this_round[name])
                if CONV1D in this_round:
                    conv1d_ratios[name].append(this_round[CONV1D] / this_round[name])
        n_steps = 100 if schedule == "DDPM100" else 10
        flops = fixed_flops + n_steps * step_flops
        unet_params = sum(p.numel() for p in policies[BASELINE].unet.parameters())
        for name in policies:
            # Bytes of U-Net weights read per chunk: every step reads all of them (fp32: 4 bytes, bf16: 2;
            # the fast path: what its matmuls read, see `fast_step_weight_bytes`); autocast also reads the
            # fp32 weights once per chunk to cast them.
            bf16 = VARIANTS[name].get("dtype") == "bfloat16"
            if name in fast_step_bytes:
                weight_gb = n_steps * fast_step_bytes[name] / 1e9
            else:
                weight_gb = (
                    unet_params
                    * ((2 * n_steps + (4 if "autocast" in name else 0)) if bf16 else 4 * n_steps)
                    / 1e9
                )
            ms = statistics.median(wall[name])
            diff = (actions[name] - actions[BASELINE]).abs()
            rows.append(
                {
                    "model": model,
                    "batch": batch,
                    "schedule": schedule,
                    "variant": name,
                    "ms_per_chunk": ms,
                    "ms_runs": wall[name],
                    "cpu_ms_per_chunk": statistics.median(cpu[name]),
                    "speedup": statistics.median(ratios[name]),
                    "speedup_vs_conv1d": statistics.median(conv1d_ratios[name])
                    if conv1d_ratios[name]
                    else None,
                    "extrapolated": len(parts) > 1,
                    "gflop_per_chunk": flops / 1e9,
                    "gflop_per_step": step_flops / 1e9,
                    "gflops_per_s": flops / (ms / 1e3) / 1e9,
                    "unet_weight_gb_per_chunk": weight_gb,
                    "weight_gb_per_s": weight_gb / (ms / 1e3),
                    "max_abs_diff": diff.max().item(),
                    "mean_abs_diff": diff.mean().item(),
                    "first_chunk_s": first[name],
                    "load_avg_1m": os.getloadavg()[0],
                }
            )
        print_table(
            [r for r in rows if r["schedule"] == schedule],
            [*TIME_COLUMNS, "max_abs_diff"],
        )
    return rows


def steady_state(policies: dict, model: str, batch: int, repeats: int, per_block: int = 3) -> list[dict]:
    """DDIM10 chunks of each variant in blocks of `per_block` back to back, as an evaluation runs one policy
    chunk after chunk; the block's first chunk is dropped. `time_batch` interleaves single chunks, so every
    chunk starts with the caches (L3) full of another variant's weights; this checks whether
    a variant gains from its own weights staying there. Ratios within a round, medians over `repeats`."""
    obs = observations(next(iter(policies.values())), batch)
    times = {name: [] for name in policies}
    ratios = {name: [] for name in policies}
    conv1d_ratios = {name: [] for name in policies}
    for r in range(repeats):
        this_round = {}
        for name, policy in policies.items():
            block = [chunk(policy, obs, "DDIM", 10, seed=r)[0] for _ in range(per_block)]
            this_round[name] = statistics.median(block[1:])
            times[name].append(this_round[name])
        for name in policies:
            ratios[name].append(this_round[BASELINE] / this_round[name])
            if CONV1D in this_round:
                conv1d_ratios[name].append(this_round[CONV1D] / this_round[name])
    rows = [
        {
            "model": model,
            "batch": batch,
            "schedule": "DDIM10",
            "variant": name,
            "ms_per_chunk": statistics.median(times[name]),
            "speedup": statistics.median(ratios[name]),
            "speedup_vs_conv1d": statistics.median(conv1d_ratios[name]) if conv1d_ratios[name] else None,
        }
        for name in policies
    ]
    print(f"steady state (blocks of {per_block} chunks, first dropped):")
    print_table(
        rows, ["model", "batch", "schedule", "variant", "ms_per_chunk", "speedup", "speedup_vs_conv1d"]
    )
    return rows


def unet_step_ablation(policy: DiffusionPolicy, batches: list[int], repeats: int) -> list[dict]:
    """ms of one U-Net step (image model) per formulation, interleaved: what each change buys."""
    unet, rows = policy.unet, []
    bf16_copy = copy.deepcopy(unet).to(torch.bfloat16)
    bf16_copy.step_encoder.float()  # it embeds integer steps; its output is cast to the input dtype
    plans = {
        "plan fp32": InferencePlan(unet, None, torch.float32),
        "plan bf16, weights not prepacked": InferencePlan(unet, None, torch.bfloat16, prepack=False),
        "plan bf16": InferencePlan(unet, None, torch.bfloat16),
    }
    for batch in batches:
        obs = policy.normalize_inputs(observations(policy, batch))
        with torch.no_grad():
            cond = policy.global_conditioning(obs)
            x, steps = (
                torch.randn(batch, policy.config.horizon, policy.config.action_dim),
                torch.full((batch,), 50),
            )
            timesteps = torch.tensor([50])
            conds = {name: plan.unet.condition(cond, timesteps) for name, plan in plans.items()}
            fns = {
                "modules fp32": functools.partial(unet, x, steps, cond),
                "modules bf16 autocast": functools.partial(unet, x, steps, cond),
                "modules with bf16 weights": functools.partial(
                    bf16_copy, x.bfloat16(), steps, cond.bfloat16()
                ),
                **{
                    name: functools.partial(plan.unet.denoise, x, conds[name], 0)
                    for name, plan in plans.items()
                },
            }
            times = {name: [] for name in fns}
            for _ in range(repeats + 1):
                for name, fn in fns.items():
                    autocast = name == "modules bf16 autocast"
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                        if autocast:
                            fn()  # autocast casts the weights at the first call in a context (once per chunk)
                        t0 = time.perf_counter()
                        fn()
                        times[name].append(1e3 * (time.perf_counter() - t0))
        base = statistics.median(times["modules fp32"][1:])
        for name, values in times.items():
            ms = statistics.median(values[1:])
            rows.append({"batch": batch, "unet_step": name, "ms": ms, "speedup": base / ms})
    print_table(rows, ["batch", "unet_step", "ms", "speedup"])
    return rows


def profile_step(policy: DiffusionPolicy, batch: int, top: int = 8) -> list[dict]:
    """Top operators (self CPU time) of one fp32 U-Net step of the modules: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    obs = policy.normalize_inputs(observations(policy, batch))
    with torch.no_grad():
        cond = policy.global_conditioning(obs)
        x, steps = (
            torch.randn(batch, policy.config.horizon, policy.config.action_dim),
            torch.full((batch,), 50),
        )
        policy.unet(x, steps, cond)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            policy.unet(x, steps, cond)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {
            "batch": batch,
            "op": e.key,
            "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[:top]
    ]


# ----------------------------------------------------------------------------------------------- parity
DDIM10 = ["policy.inference_scheduler=DDIM", "policy.num_inference_steps=10"]
DDPM100 = ["policy.inference_scheduler=DDPM", "policy.num_inference_steps=100"]


def _inference_overrides(variant: str) -> list[str]:
    """The command-line overrides of a `VARIANTS` entry, e.g. `inference.fast=true`."""
    return [f"inference.{key}={str(value).lower()}" for key, value in VARIANTS[variant].items()]


PARITY_RUNS = {
    "fp32 DDIM10": DDIM10,
    "fast bf16 DDIM10": DDIM10 + _inference_overrides("fast bf16"),
    "fp32 DDPM100": DDPM100,
    "fast bf16 DDPM100": DDPM100 + _inference_overrides("fast bf16"),
    # int8 weights are read only by matmuls with <= INT8_MAX_ROWS rows: compare it at --eval-batch 1.
    "fast bf16 int8 DDIM10": DDIM10 + _inference_overrides("fast bf16 int8"),
    # The batch-1 setting (int8 weights are read at batch 1 only): compare it at --eval-batch 1.
    "fast bf16 int8 compiled DDIM10": DDIM10 + _inference_overrides("fast bf16 int8 compiled"),
    "fast bf16 compiled DDIM10": DDIM10 + _inference_overrides("fast bf16 compiled"),
}
DEFAULT_PARITY_RUNS = ["fp32 DDIM10", "fast bf16 DDIM10", "fp32 DDPM100", "fast bf16 DDPM100"]


def _dataset_observations(cfg, policy: DiffusionPolicy, n: int) -> dict | None:
    """`n` observation windows of the demonstrations (the states a trained policy meets), or None."""
    from lerobot.config import env_config
    from lerobot.datasets import make_dataset

    try:
        env_cfg = env_config(cfg)
        dataset = make_dataset(cfg.dataset, env_cfg, policy.config.delta_timestamps(env_cfg.fps))
    except Exception as e:  # no data here: the caller falls back to env resets
        print(f"dataset unavailable ({e}); using env reset observations")
        return None
    index = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:n].tolist()
    items = dataset.__getitems__(index)
    return {k: items[k] for k in policy.config.input_features}


def _schedule(run: str) -> tuple[str, int]:
    """(scheduler, steps) of a `PARITY_RUNS` name."""
    return ("DDPM", 100) if run.endswith("DDPM100") else ("DDIM", 10)


def _summary(name: str, successes: torch.Tensor, max_rewards: torch.Tensor) -> dict:
    n = successes.numel()
    p = successes.mean().item()
    return {
        "run": name,
        "n_episodes": n,
        "pc_success": 100 * p,
        "pc_success_se": 100 * (p * (1 - p) / n) ** 0.5,  # binomial standard error
        "avg_max_reward": max_rewards.mean().item(),
        "avg_max_reward_se": (max_rewards.std() / n**0.5).item(),
    }


def parity(
    checkpoint: Path,
    n_episodes: int,
    batch: int,
    start_seed: int,
    repeats: int,
    noise_seeds: list[int],
    runs: list[str],
) -> dict:
    """Success parity on a trained checkpoint and the chunk-time ratio DDPM100 / DDIM10 at the eval batch,
    for the `runs` of `PARITY_RUNS`.

    Every run evaluates the same `n_episodes` initial states (env seeds from `start_seed`) once per noise
    seed (`set_seed` before `eval_policy`: the policy's sampling noise); rows per (run, noise seed) and
    pooled over the noise seeds. The spread between noise seeds of one run shows what chance alone does.
    """
    from lerobot.checkpoints.run import load_run_policy
    from lerobot.checkpoints.run_layout import resolve_checkpoint_dir
    from lerobot.cli.compose import checkpoint_config
    from lerobot.config import env_config
    from lerobot.envs import make_env
    from lerobot.envs.observation import observation_to_batch
    from lerobot.random_state import set_seed
    from lerobot.rollout import eval_policy

    ckpt = resolve_checkpoint_dir(checkpoint)
    common = [f"eval.n_episodes={n_episodes}", f"eval.batch_size={batch}", f"eval.start_seed={start_seed}"]
    cfgs = {name: checkpoint_config(ckpt, PARITY_RUNS[name] + common) for name in runs}
    policies = {name: load_run_policy(ckpt, cfg=cfg)[0] for name, cfg in cfgs.items()}
    with inference_layers(policies, {name: cfg.inference for name, cfg in cfgs.items()}):
        env_cfg = env_config(checkpoint_config(ckpt, common))
        evals, per_run = [], {name: ([], []) for name in policies}
        for noise_seed in noise_seeds:
            for name, policy in policies.items():
                set_seed(noise_seed)
                env = make_env(env_cfg, min(batch, n_episodes), use_async=False)
                try:
                    info = eval_policy(env, policy, n_episodes, start_seed=start_seed, progress=False)
                finally:
                    env.close()
                successes = torch.tensor([float(ep["success"]) for ep in info["per_episode"]])
                max_rewards = torch.tensor([ep["max_reward"] for ep in info["per_episode"]])
                per_run[name][0].append(successes)
                per_run[name][1].append(max_rewards)
                row = _summary(name, successes, max_rewards)
                row.update(
                    noise_seed=noise_seed,
                    eval_s=info["aggregated"]["eval_s"],
                    max_reward=max_rewards.tolist(),
                )
                evals.append(row)
                print_table([row], ["run", "noise_seed", "pc_success", "avg_max_reward", "eval_s"])
        pooled = [_summary(name, torch.cat(s), torch.cat(r)) for name, (s, r) in per_run.items()]
        print(f"pooled over noise seeds {noise_seeds}:")
        print_table(
            pooled,
            ["run", "n_episodes", "pc_success", "pc_success_se", "avg_max_reward", "avg_max_reward_se"],
        )

        # Chunk time at the eval batch (and 1, 8), DDPM100 vs DDIM10 and fp32 vs fast, interleaved.
        cfg = checkpoint_config(ckpt, common)
        obs = _dataset_observations(cfg, next(iter(policies.values())), 256)
        if obs is None:
            env = make_env(env_config(cfg), batch, use_async=False)
            raw, _ = env.reset(seed=[start_seed + i for i in range(batch)])
            env.close()
            first = observation_to_batch(raw)
            obs = {
                k: v.unsqueeze(1).expand(-1, cfg.policy.n_obs_steps, *v.shape[1:]) for k, v in first.items()
            }
        timing = []
        for b in sorted({1, 8, batch}):
            sub = {k: v[:b] for k, v in obs.items()}
            times = {name: [] for name in policies}
            for r in range(repeats + 1):
                for name, policy in policies.items():
                    ms = chunk(policy, sub, *_schedule(name), seed=r)[0]
                    if r:  # the first round warms up (and compiles)
                        times[name].append(ms)
            for name in policies:
                timing.append({"batch": b, "run": name, "ms_per_chunk": statistics.median(times[name])})
        for row in timing:
            same = {r["run"]: r["ms_per_chunk"] for r in timing if r["batch"] == row["batch"]}
            ddpm, ddim = (
                same.get(row["run"].replace("DDIM10", "DDPM100")),
                same.get(row["run"].replace("DDPM100", "DDIM10")),
            )
            row["ddpm100_over_ddim10"] = ddpm / ddim if ddpm and ddim and ddpm is not ddim else None
            fp32 = same.get("fp32 " + row["run"].split(" ")[-1])
            row["fp32_over_this"] = fp32 / row["ms_per_chunk"] if fp32 else None
        print_table(timing, ["batch", "run", "ms_per_chunk", "ddpm100_over_ddim10", "fp32_over_this"])

        # Actions of every other run vs fp32 with the same schedule, on demonstration observations, same noise,
        # in action units, in chunks of the eval batch (int8 weights are read at small batches only).
        diffs = []
        for name, policy in policies.items():
            ref = policies.get("fp32 " + name.split(" ")[-1])
            if ref is None or ref is policy:
                continue
            parts = [
                {k: v[i : i + batch] for k, v in obs.items()}
                for i in range(0, len(obs[next(iter(obs))]), batch)
            ]
            a = torch.cat([chunk(ref, part, *_schedule(name), seed=7)[2] for part in parts])
            b = torch.cat([chunk(policy, part, *_schedule(name), seed=7)[2] for part in parts])
            d = (a - b).abs()
            diffs.append(
                {
                    "run": name,
                    "chunk_batch": batch,
                    "n_observations": a.shape[0],
                    "max_abs_diff": d.max().item(),
                    "mean_abs_diff": d.mean().item(),
                    "p99_abs_diff": d.flatten().quantile(0.99).item(),
                }
            )
        print_table(
            diffs, ["run", "chunk_batch", "n_observations", "max_abs_diff", "mean_abs_diff", "p99_abs_diff"]
        )
        return {
            "checkpoint": str(ckpt),
            "evals": evals,
            "pooled": pooled,
            "chunk_timing": timing,
            "action_diffs": diffs,
        }


# ----------------------------------------------------------------------------------------------- report
def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    schedules = ["DDIM10", "DDPM100"]
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 4 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for j, schedule in enumerate(schedules):
            ax = axes[i][j]
            for variant in VARIANTS:
                points = sorted(
                    (r["batch"], r["ms_per_chunk"])
                    for r in rows
                    if r["model"] == model and r["schedule"] == schedule and r["variant"] == variant
                )
                if points:
                    ax.plot(*zip(*points), marker="o", label=variant)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("batch (envs per chunk)")
            ax.set_ylabel("ms per chunk")
            ax.set_title(
                f"{model}: {schedule}"
                + (" (extrapolated)" if model == "image" and schedule == "DDPM100" else "")
            )
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _jsonable(args: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in args.items()}


def _previous_results() -> dict:
    """The current results/inference.json, or {} if there is none yet."""
    path = RESULTS_DIR / "inference.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_parity(entry: dict) -> Path:
    """Put one parity run into the `parity` list of results/inference.json, replacing the entry with the
    same `parity_runs` and `eval_batch`; the timing results in the file stay as they are."""
    results = _previous_results()
    same = (entry["parity_runs"], entry["eval_batch"])
    kept = [e for e in results.get("parity", []) if (e.get("parity_runs"), e.get("eval_batch")) != same]
    results["parity"] = [*kept, entry]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "inference.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2))
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 50])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        help=f"variants to time (always with {BASELINE!r}, the baseline of every ratio)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--compile-models",
        nargs="*",
        default=["image"],
        choices=list(MODELS),
        help="models that also get the torch.compile variant (~1 min of compiling per batch size each)",
    )
    parser.add_argument(
        "--parity",
        type=Path,
        metavar="CHECKPOINT",
        help="instead: success parity of a trained checkpoint (--parity-runs, default fp32 vs fast bf16, "
        "DDIM10 vs DDPM100), added to the `parity` list of results/inference.json",
    )
    parser.add_argument("--parity-runs", nargs="+", default=DEFAULT_PARITY_RUNS, choices=list(PARITY_RUNS))
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--eval-batch", type=int, default=50)
    parser.add_argument("--start-seed", type=int, default=100000)
    parser.add_argument("--noise-seeds", type=int, nargs="+", default=[1000, 1001, 1002])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.parity is not None:
        result = parity(
            args.parity,
            args.episodes,
            args.eval_batch,
            args.start_seed,
            args.repeats,
            args.noise_seeds,
            args.parity_runs,
        )
        entry = {"parity_runs": args.parity_runs, "eval_batch": args.eval_batch, "machine": machine_info()}
        entry.update(result, args=_jsonable(vars(args)))
        path = save_parity(entry)
        print(f"wrote the parity entry {args.parity_runs} at eval batch {args.eval_batch} to {path}")
        return

    peaks = matmul_peaks()
    peaks["read_gb_per_s"] = read_bandwidth()
    print(f"reading 1 GiB: {peaks['read_gb_per_s']:.1f} GB/s")
    print(
        f"2048x2048 matmul on {args.threads} threads: fp32 {peaks['float32_best']:.0f} GFLOP/s, "
        f"bf16 {peaks['bfloat16_best']:.0f} GFLOP/s (best of 10)"
    )
    rows, ablation, profile, steady = [], [], [], []
    for model in args.models:
        variants = [
            v
            for v in VARIANTS
            if (v == BASELINE or v in args.variants) and (model in args.compile_models or "compiled" not in v)
        ]
        policies = build_policies(MODELS[model], variants)
        with inference_layers(policies, variant_settings(variants)):
            n_params = sum(p.numel() for p in policies[BASELINE].parameters())
            print(f"\n{model}: {n_params / 1e6:.1f}M parameters, load average {os.getloadavg()[0]:.1f}")
            for batch in args.batch_sizes:
                rows += time_batch(policies, model, batch, args.repeats, ddpm_direct=model != "image")
                if model == "image" and batch <= 8:
                    steady += steady_state(policies, model, batch, args.repeats)
            if model == "image":
                ablation = unet_step_ablation(
                    policies[BASELINE], [b for b in args.batch_sizes if b <= 8], args.repeats
                )
                profile = [e for b in (1, 8) for e in profile_step(policies[BASELINE], b)]
        del policies
    for row in rows:
        row["pct_of_fp32_peak"] = 100 * row["gflops_per_s"] / peaks["float32_best"]
        row["pct_of_bf16_peak"] = 100 * row["gflops_per_s"] / peaks["bfloat16_best"]
        row["pct_of_read_bandwidth"] = 100 * row["weight_gb_per_s"] / peaks["read_gb_per_s"]
    path = save_results(
        "inference",
        rows,
        {
            "peaks_gflops": peaks,
            "unet_step_ablation": ablation,
            "steady_state": steady,
            "fp32_step_profile": profile,
            "args": _jsonable(vars(args)),
            "parity": _previous_results().get("parity", []),
        },
    )
    plot(rows, RESULTS_DIR / "inference.png")
    print("\nsummary (speedup = fp32 eager / variant, same rounds):")
    print_table(
        rows,
        [*TIME_COLUMNS, "pct_of_bf16_peak", "pct_of_read_bandwidth", "mean_abs_diff", "extrapolated"],
    )
    print(f"wrote {path} and {RESULTS_DIR / 'inference.png'}; machine: {machine_info()}")


if __name__ == "__main__":
    main()
