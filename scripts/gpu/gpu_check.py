"""The measurements of `gpu_check.sh`: training steps, chunk timing and a 50-episode image evaluation on CUDA.

    python scripts/gpu/gpu_check.py [--cpu-fallback] [--junit FILE] [--out benchmarks/results/gpu_check.json] \
        [--sections train_steps recipe_segment ...] [--data-root DIR]

Sections (each one's failure is recorded in the JSON, the others still run):
- `train_steps`: one training step of each policy (Diffusion image and keypoints at the paper's size,
  TD-MPC, ACT with LeRobot's defaults) in fp32 and under bf16 autocast (`training.use_amp`): the trainers' `TrainStep` on a synthetic
  batch moved with their `to_device`; median of 3 timed steps after a warm-up, peak memory, and whether the
  steps made a host sync (`torch.cuda.set_sync_debug_mode("error")` around them).
- `chunk_timing`: `predict_action_chunk` of the paper-size image Diffusion Policy at batch 1, 8 and 50, fp32
  and bf16 autocast (`inference.dtype=bfloat16`), the config's own sampler.
- `eval`: `evaluate` (what training and `scripts/eval.py` run) of that policy, untrained, over 50 PushT
  image episodes at 50 envs: wall time and env steps per second (its success rate means nothing).
- `recipe_segment`: `+experiment=diffusion_pusht_gpu` trained through the trainer on the PushT demonstrations
  for a few hundred steps, with and without `training.compile`: step time and samples/s from its metrics log
  (the first log window, which holds the warm-up and the compile, left out), peak GPU memory; then
  `scripts/eval.py` over 50 episodes at 50 envs of the checkpoint trained without compile, timed.
- `tests`: the pytest summary read from `--junit` (gpu_check.sh runs the suite first).

Without CUDA the JSON says so and the sections are skipped, unless `--cpu-fallback`: then every section runs
on the CPU with tiny models and short episodes, which checks the script, not the machine.
"""

from __future__ import annotations

# isort: off
import sys
from pathlib import Path

import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# The benchmark helpers it shares (bench_train, bench_inference, common, tiny) live in benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
# isort: on
import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable

import torch
from bench_inference import synthetic_stats
from bench_train import default_data_root
from common import RESULTS_DIR, machine_info
from tiny import PUSHT_8PX, TINY_ACT, TINY_DIFFUSION, TINY_TDMPC

from lerobot.accel import accelerated
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import InferenceConfig, env_config
from lerobot.constants import ACTION_IS_PAD
from lerobot.evaluation import evaluate
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.runtime.files import write_json
from lerobot.training.update import TrainStep, to_device

IMAGE = ["policy=diffusion", "env=pusht"]
KEYPOINTS = ["policy=diffusion", "env=pusht_keypoints"]
TDMPC = ["policy=tdmpc", "env=pusht_keypoints"]
ACT = ["policy=act", "env=pusht"]
RECIPE = ["+experiment=diffusion_pusht_gpu"]
# --cpu-fallback: models and episodes small enough for a 2-core CPU (the tests' tiny configs).
TINY_IMAGE_ENV = [*PUSHT_8PX, "env.max_episode_steps=10", "eval.use_async_envs=false"]
TINY_IMAGE = TINY_IMAGE_ENV + [
    "policy.crop_shape=[6,6]",
    "policy.spatial_softmax_num_keypoints=4",
    "policy.num_inference_steps=3",
]
# The recipe on the CPU: the real 96x96 frames resized small, a tiny U-Net, a few steps, short episodes.
TINY_RECIPE = TINY_DIFFUSION + [
    "policy.resize_shape=[24,24]",
    "policy.crop_shape=[20,20]",
    "policy.num_inference_steps=3",
    "policy.inference_scheduler=DDIM",
    "training.batch_size=4",
    "training.num_workers=0",
    "env.max_episode_steps=10",
    "eval.use_async_envs=false",
]
BATCHES = (1, 8, 50)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall seconds of `fn` over `repeats` calls after one warm-up, the device's work included."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@contextlib.contextmanager
def _sync_check(device: torch.device, result: dict) -> None:
    """Record in `result["host_sync"]` whether the code inside made a CUDA host sync (None off CUDA)."""
    if device.type != "cuda":
        result["host_sync"] = None
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
        result["host_sync"] = False
    except RuntimeError as e:
        result["host_sync"] = str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _policy(overrides: list[str], device: torch.device):
    cfg = compose_config(overrides)
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    torch.manual_seed(0)
    stats = None if policy_cfg.name == "tdmpc" else synthetic_stats(policy_cfg)
    return cfg, policy_cfg, make_policy(policy_cfg, stats).to(device)


def _training_batch(policy_cfg, batch_size: int) -> dict[str, torch.Tensor]:
    """A random batch shaped as the trainers feed `policy_cfg`'s policy, in pinned memory when CUDA is here."""
    if policy_cfg.name == "tdmpc":
        steps, horizon = policy_cfg.horizon + 1, policy_cfg.horizon
    else:  # the frames the dataset gives one sample: observations, then the action sequence
        offsets = policy_cfg.delta_timestamps(10)  # any fps: only the number of offsets is used
        steps = len(next(offsets[k] for k in policy_cfg.input_features))
        horizon = len(offsets[policy_cfg.action_key])
    batch = {k: torch.rand(batch_size, steps, *f.shape) for k, f in policy_cfg.input_features.items()}
    batch["action"] = torch.rand(batch_size, horizon, policy_cfg.action_dim)
    if policy_cfg.name == "tdmpc":
        batch["next.reward"] = torch.rand(batch_size, horizon)
        batch["next.terminated"] = torch.zeros(batch_size, horizon)
    else:
        batch[ACTION_IS_PAD] = torch.zeros(batch_size, horizon, dtype=torch.bool)
    return {k: v.pin_memory() if torch.cuda.is_available() else v for k, v in batch.items()}


def train_steps(device: torch.device, tiny: bool) -> list[dict]:
    configs = {
        "diffusion_image": IMAGE + (TINY_DIFFUSION + TINY_IMAGE if tiny else []),
        "diffusion_keypoints": KEYPOINTS + (TINY_DIFFUSION if tiny else []),
        "tdmpc": TDMPC + (TINY_TDMPC if tiny else []),
        # At PushT's 96x96 frames: with the 8x8 ones ACT's bf16 gradients can overflow on the CPU.
        "act_image": ACT + (TINY_ACT if tiny else []),
    }
    return [
        row
        for name, overrides in configs.items()
        for row in _policy_train_steps(name, overrides, device, tiny)
    ]


def _policy_train_steps(name: str, overrides: list[str], device: torch.device, tiny: bool) -> list[dict]:
    """fp32 and bf16 autocast rows of one policy's training step."""
    cfg, policy_cfg, policy = _policy(overrides, device)
    batch_size = 8 if tiny else policy_cfg.batch_size
    update = TrainStep(policy.train(), policy_cfg, cfg.training, total_updates=100)
    batch = _training_batch(policy_cfg, batch_size)

    def step() -> None:
        update(to_device(batch, device), where="check")
        if policy_cfg.name == "tdmpc":
            policy.update_target()

    rows = []
    for amp in (False, True):
        update.use_amp = amp
        row = {"policy": name, "dtype": "bf16 autocast" if amp else "fp32", "batch": batch_size}
        step()  # warm-up: lazy initialisation (cuDNN plans, the statistics check) may sync once
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with _sync_check(device, row):
            for _ in range(3):
                step()
        row["loss"] = update.metrics.pop()["loss"]
        row["ms_per_step"] = 1e3 * _timed(step, device, repeats=3)
        if device.type == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row["params_m"] = sum(p.numel() for p in policy.parameters()) / 1e6
        rows.append(row)
        print(row, flush=True)
    return rows


def chunk_timing(device: torch.device, tiny: bool) -> list[dict]:
    _, policy_cfg, policy = _policy(IMAGE + (TINY_DIFFUSION + TINY_IMAGE if tiny else []), device)
    policy.eval()
    rows = []
    for dtype in ("float32", "bfloat16"):
        with accelerated(policy, InferenceConfig(dtype=dtype)):
            for batch_size in BATCHES:
                obs = {
                    k: torch.rand(batch_size, policy_cfg.n_obs_steps, *f.shape, device=device)
                    for k, f in policy_cfg.input_features.items()
                }
                seconds = _timed(lambda obs=obs: policy.predict_action_chunk(obs), device, repeats=3)
                row = {
                    "dtype": dtype,
                    "batch": batch_size,
                    "ms_per_chunk": 1e3 * seconds,
                    "sampler": f"{policy_cfg.inference_scheduler} x {policy_cfg.num_inference_steps or policy_cfg.num_train_timesteps}",
                }
                rows.append(row)
                print(row, flush=True)
    return rows


def image_eval(device: torch.device, tiny: bool) -> dict:
    overrides = IMAGE + (TINY_DIFFUSION + TINY_IMAGE if tiny else [])
    overrides += ["eval.n_episodes=50", "eval.batch_size=50", "eval.max_episodes_rendered=0"]
    cfg, _, policy = _policy(overrides, device)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        info = evaluate(cfg, policy, Path(out))
        wall = time.perf_counter() - t0
    agg = info["aggregated"]
    steps = sum(e["n_steps"] for e in info["per_episode"])
    result = {"episodes": len(info["per_episode"]), "env_steps": steps, "wall_s": wall}
    result.update(env_steps_per_s=steps / wall, pc_success_untrained=agg["pc_success"])
    print(result, flush=True)
    return result


def recipe_segment(device: torch.device, tiny: bool, data_root: str | None) -> dict:
    """A few hundred steps of the GPU recipe through the command line, with and without compile, and a timed
    50-episode evaluation of the checkpoint trained without it (see the module docstring)."""
    if data_root is None or not (Path(data_root) / "pusht_cchi_v7_replay.zarr").exists():
        return {"status": f"skipped: no PushT demonstrations under {data_root} (pass --data-root)"}
    steps, log_freq = (6, 2) if tiny else (300, 50)
    common = [*RECIPE, *(TINY_RECIPE if tiny else []), f"dataset.root={data_root}", f"training.steps={steps}"]
    common += [f"training.log_freq={log_freq}", f"training.save_freq={steps}", "eval.freq=0"]
    result: dict = {"steps": steps, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for compiled in (False, True):
            run_dir = Path(tmp) / f"compile_{compiled}"
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            code = train_main([*common, f"training.compile={str(compiled).lower()}", f"output_dir={run_dir}"])
            wall = time.perf_counter() - t0
            if code != 0:
                raise RuntimeError(f"training with compile={compiled} exited with {code}")
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            train = [
                r for r in map(json.loads, lines) if r.get("split", "train") == "train" and "update_s" in r
            ]
            steady = train[1:] or train
            row = {
                "compile": compiled,
                "wall_s": wall,
                "s_per_step": statistics.median(r["update_s"] + r["data_s"] for r in steady),
                "update_s": statistics.median(r["update_s"] for r in steady),
                "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
                "loss_last": train[-1]["loss"],
            }
            if device.type == "cuda":
                row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            result["rows"].append(row)
            print(row, flush=True)
        eval_dir = Path(tmp) / "eval"
        episodes = (
            ["eval.n_episodes=4", "eval.batch_size=4"]
            if tiny
            else ["eval.n_episodes=50", "eval.batch_size=50"]
        )
        t0 = time.perf_counter()
        code = eval_main(
            ["--checkpoint", str(Path(tmp) / "compile_False"), "--output-dir", str(eval_dir), *episodes,
             "eval.max_episodes_rendered=0", *(["env.max_episode_steps=10"] if tiny else [])]
        )  # fmt: skip
        if code != 0:
            raise RuntimeError(f"the evaluation exited with {code}")
        agg = json.loads((eval_dir / "eval_info.json").read_text())["aggregated"]
        result["eval"] = {
            "wall_s": time.perf_counter() - t0,
            "episodes": agg["n_episodes"],
            "eval_s": agg["eval_s"],
            "env_steps_per_s": agg["env_steps_per_s"],
            "pc_success": agg["pc_success"],
        }
        print(result["eval"], flush=True)
    return result


def pytest_summary(junit: Path) -> dict:
    """Counts and failing test ids from a JUnit XML file written by pytest."""
    if not junit.is_file():
        return {"status": "not run (no JUnit file)"}
    suite = ET.parse(junit).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {**counts, "time_s": float(suite.get("time", 0.0)), "failed": failed}


SECTIONS = {
    "train_steps": train_steps,
    "chunk_timing": chunk_timing,
    "eval": image_eval,
    "recipe_segment": recipe_segment,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-fallback", action="store_true", help="without CUDA, run tiny versions on the CPU"
    )
    parser.add_argument("--junit", type=Path, help="pytest's JUnit XML of the test suite run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "gpu_check.json")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument(
        "--data-root", default=default_data_root(), help="directory with the PushT zarr (recipe_segment)"
    )
    args = parser.parse_args()
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    result: dict = {"machine": machine_info(), "cuda_available": cuda}
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as `resolve_device`
    result["mode"] = (
        "cuda" if cuda else "cpu-fallback" if args.cpu_fallback else "skipped: CUDA is not available"
    )
    sections: dict = {"tests": pytest_summary(args.junit) if args.junit else {"status": "not run"}}
    failed = bool(sections["tests"].get("failures") or sections["tests"].get("errors"))
    if cuda or args.cpu_fallback:
        device = torch.device("cuda" if cuda else "cpu")
        tiny = not cuda
        runs = {**SECTIONS, "recipe_segment": functools.partial(recipe_segment, data_root=args.data_root)}
        for name in args.sections:
            try:
                sections[name] = runs[name](device, tiny)
            except Exception:  # noqa: BLE001 - a failing section is reported, the others still run
                sections[name] = {"status": "failed", "error": traceback.format_exc(limit=3)}
                failed = True
    result["sections"] = sections
    result["wall_s"] = time.perf_counter() - t0
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
