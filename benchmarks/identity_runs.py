"""Reference runs whose outputs must not change when code is only reorganised.

Runs, through the command line, into `OUT/`:
- `tdmpc`: a tiny TD-MPC on Pendulum for 40 transitions with its replay buffer, then resumed to 60;
- `diffusion`: a tiny Diffusion Policy on PushT keypoints with EMA for 6 steps (evaluated at step 6), then
  resumed to 12, then `scripts/eval.py` on the last checkpoint;
- `ddp`: the same Diffusion run on 2 processes (`torchrun`, gloo) for 6 steps.

and prints one line per output: the sha256 of each checkpoint's tensors and of its header metadata, and of each
`metrics.jsonl` / `eval_info.json` without its wall-clock fields. Compare two trees' lines with `diff`:

    python benchmarks/identity_runs.py --data-root ../shared/data/pusht --out /tmp/before > before.txt
    ... change the code ...
    python benchmarks/identity_runs.py --data-root ../shared/data/pusht --out /tmp/after > after.txt
    diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open
from tiny import TDMPC_PENDULUM, TINY_DIFFUSION

ROOT = Path(__file__).resolve().parents[1]

# The tests' TD-MPC run (tests/test_online_train.py), saving its replay buffer so that the resume is exact.
TDMPC = [*TDMPC_PENDULUM, "training.save_buffer=true"]
DIFFUSION = [
    "policy=diffusion",
    "env=pusht_keypoints",
    *TINY_DIFFUSION,
    "policy.num_inference_steps=3",
    "policy.scheduler_warmup_steps=2",
    "policy.use_ema=true",
    "training.batch_size=4",
    "training.num_workers=0",
    "training.log_freq=2",
    "training.save_freq=6",
    "eval.freq=6",
    "eval.n_episodes=2",
    "eval.batch_size=2",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=0",
    "env.max_episode_steps=8",
]
# Wall-clock figures: they differ from run to run whatever the code.
TIMING_KEYS = {"time", "wall_time", "eval_s", "eval_ep_s", "data_s", "update_s", "collect_s", "train_time_s"}


def _is_timing(key: str) -> bool:
    return key in TIMING_KEYS or key.endswith("_per_s")


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _is_timing(k)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    if isinstance(value, float):
        # The standalone evaluation's rewards differ in their last bit from one launch to the next, with
        # any code: 12 significant digits keep every real difference.
        return float(f"{value:.12g}")
    return value


def metadata_digest(path: Path) -> str:
    """sha256 of a safetensors file's header metadata (sorted by key)."""
    with safe_open(path, framework="pt") as f:
        return hashlib.sha256(json.dumps(f.metadata() or {}, sort_keys=True).encode()).hexdigest()


def tensors_digest(path: Path) -> str:
    """sha256 of a safetensors file's tensors (sorted by name)."""
    digest = hashlib.sha256()
    with safe_open(path, framework="pt") as f:
        for key in sorted(f.keys()):  # noqa: SIM118 (safe_open is not a mapping)
            tensor = f.get_tensor(key).contiguous()
            digest.update(key.encode() + str(tensor.dtype).encode() + str(tuple(tensor.shape)).encode())
            digest.update(tensor.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def json_digest(path: Path, lines: bool) -> str:
    """sha256 of a JSON (or JSON-lines) file with its wall-clock fields and local paths removed."""
    text = path.read_text()
    records = [json.loads(x) for x in text.splitlines()] if lines else [json.loads(text)]
    cleaned = [_strip(r) for r in records]
    for r in cleaned:
        if isinstance(r, dict):
            r.pop("config", None)  # holds the run's own paths
            r.pop("video_paths", None)
            if isinstance(r.get("checkpoint"), dict):
                r["checkpoint"].pop("path", None)  # the evaluated checkpoint's directory, under OUT
    return hashlib.sha256(json.dumps(cleaned, sort_keys=True).encode()).hexdigest()


def run(cmd: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-root", type=Path, required=True, help="directory holding pusht_cchi_v7_replay.zarr"
    )
    parser.add_argument("--out", type=Path, required=True, help="where the runs go (emptied first)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    # LEROBOT_RECIPE=paper: the runs take the policies' defaults under their overrides on any machine (on a CPU,
    # recipe=auto would compose the CPU recipe of the policy and env); older trees ignore it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    env["LEROBOT_RECIPE"] = "paper"
    data = [f"dataset.root={args.data_root.resolve()}", f"dataset.cache_dir={args.out / 'cache'}"]
    train = [sys.executable, "scripts/train.py"]

    tdmpc = args.out / "tdmpc"
    run([*train, *TDMPC, "training.steps=40", f"output_dir={tdmpc}"], env)
    run([*train, *TDMPC, "training.steps=60", f"output_dir={tdmpc}"], env)
    diffusion = args.out / "diffusion"
    run([*train, *DIFFUSION, *data, "training.steps=6", f"output_dir={diffusion}"], env)
    run([*train, *DIFFUSION, *data, "training.steps=12", f"output_dir={diffusion}"], env)
    evaluation = args.out / "diffusion_eval"
    run(
        [sys.executable, "scripts/eval.py", "--checkpoint", str(diffusion), "--output-dir", str(evaluation)],
        env,
    )
    ddp = args.out / "ddp"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29533",
    ]
    run([*torchrun, "scripts/train.py", *DIFFUSION, *data, "training.steps=6", f"output_dir={ddp}"], env)

    for run_dir in (tdmpc, diffusion, ddp):
        for ckpt in sorted((run_dir / "checkpoints").glob("[0-9]*")):
            weights = ckpt / "model.safetensors"
            print(f"{ckpt.relative_to(args.out)}/model.safetensors tensors {tensors_digest(weights)}")
            print(f"{ckpt.relative_to(args.out)}/model.safetensors metadata {metadata_digest(weights)}")
        print(f"{run_dir.name}/metrics.jsonl {json_digest(run_dir / 'metrics.jsonl', lines=True)}")
        for info in sorted((run_dir / "eval").glob("*/eval_info.json")):
            print(f"{info.relative_to(args.out)} {json_digest(info, lines=False)}")
    print(f"diffusion_eval/eval_info.json {json_digest(evaluation / 'eval_info.json', lines=False)}")


if __name__ == "__main__":
    main()
