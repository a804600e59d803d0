"""Training step of the paper-size image Diffusion Policy (or ACT) against LeRobot's, timed in one run.

    cd benchmarks && python bench_peer.py [--policy diffusion|act] [--steps 5] [--threads 2] \
        [--peer-python $LEROBOT_VENV/bin/python]

The peer is LeRobot 0.6.x's `DiffusionPolicy` with its PushT-image defaults (`peer_lerobot_step.py`, run
by a Python with LeRobot installed, `$LEROBOT_VENV/bin/python` by default). Ours is `policy=diffusion
env=pusht` stepped by the trainers' `TrainStep` on batches from the real loader (batch 64, the same model
sizes). Per round, one update each, alternating: LeRobot fp32, ours fp32, LeRobot bf16 autocast, ours bf16
autocast, and ours bf16 with the optimizer and EMA the trainers used before (a per-tensor AdamW loop and
diffusers' `EMAModel` update), so that load drift hits every column alike. The process that is not
stepping waits on a pipe. The first round warms up and is dropped; ratios are per round, then the median.
Only the update is timed (forward, backward, clipping, optimizer, LR schedule, and our EMA; LeRobot 0.6 keeps
no EMA); batch assembly is outside both. Writes results/peer_<cpu vendor>.json (`peer_intel.json`,
`peer_amd.json`), so that the ratio on each kind of CPU is kept.

`--policy act`: LeRobot's ACT with its defaults (the paper's model, ResNet-18 from scratch, chunks of 100,
batch 8) on PushT's image and state against `policy=act env=pusht` (the same model and batch); columns
fp32 and bf16 autocast of each; results/peer_act_<cpu vendor>.json.
"""

from __future__ import annotations

# isort: off
import lerobot  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)

# isort: on
import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
from bench_train import default_data_root, diffusion_training
from common import machine_info, print_table, save_results

from lerobot.training.update import TrainStep

HERE = Path(__file__).resolve().parent
COLUMNS = ("lerobot fp32", "ours fp32", "lerobot bf16", "ours bf16", "ours bf16 before")


class Peer:
    """LeRobot's step in its own Python process, one update per request."""

    def __init__(self, python: Path, threads: int, policy: str):
        env = {**os.environ, "PYTHONPATH": "", "OMP_WAIT_POLICY": "PASSIVE"}
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "peer_lerobot_step.py"), str(threads), policy],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise SystemExit(f"the LeRobot step did not start ({python}); see its error above")
        self.n_params = int(ready[1])

    def step(self, mode: str) -> float:
        """Seconds of one LeRobot update in `mode` ("fp32" or "bf16")."""
        self.proc.stdin.write(mode + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        """Ask the process to quit and wait for it."""
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


# The Python of a virtual environment with LeRobot installed (`$LEROBOT_VENV`).
DEFAULT_PEER_PYTHON = Path(os.environ.get("LEROBOT_VENV", "lerobot-venv")) / "bin" / "python"


def cpu_vendor(cpu: str) -> str:
    """`intel`, `amd` or `other`, from a CPU model name."""
    for vendor in ("intel", "amd"):
        if vendor in cpu.lower():
            return vendor
    return "other"


def before_step(update: TrainStep, policy) -> TrainStep:
    """A copy of `update` on the same policy with the trainers' former optimizer and EMA: AdamW's per-tensor
    loop and diffusers' `EMAModel.step`."""
    from diffusers.training_utils import EMAModel

    old = TrainStep.__new__(TrainStep)
    old.__dict__.update(update.__dict__)
    settings = {k: update.optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    old.optimizer = torch.optim.AdamW(policy.optimizer_param_groups(), **settings, foreach=False)
    old.ema = EMAModel(policy.parameters(), decay=0.9999, use_ema_warmup=True, power=0.75)
    return old


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=["diffusion", "act"], default="diffusion")
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=default_data_root(), help="directory with the PushT zarr")
    parser.add_argument(
        "--peer-python",
        type=Path,
        default=DEFAULT_PEER_PYTHON,
        help="a Python with LeRobot 0.6.x installed",
    )
    args = parser.parse_args(argv)
    if not args.peer_python.is_file():
        raise SystemExit(f"{args.peer_python} not found: set LEROBOT_VENV or pass --peer-python")
    torch.set_num_threads(args.threads)
    extra = [f"dataset.root={args.data_root}"] if args.data_root else []
    _, policy, update, batches, batch_size = diffusion_training(
        [f"policy={args.policy}", "env=pusht", *extra]
    )
    columns = COLUMNS if args.policy == "diffusion" else COLUMNS[:4]
    peer = Peer(args.peer_python, args.threads, args.policy)

    def ours(step: TrainStep, amp: bool) -> float:
        batch = next(batches)
        step.use_amp = amp
        start = time.perf_counter()
        step(batch, where="benchmark step")
        step.metrics.pop()  # reads the loss back, as LeRobot's step does
        return time.perf_counter() - start

    runs = {
        "lerobot fp32": lambda: peer.step("fp32"),
        "ours fp32": lambda: ours(update, amp=False),
        "lerobot bf16": lambda: peer.step("bf16"),
        "ours bf16": lambda: ours(update, amp=True),
    }
    if args.policy == "diffusion":
        old = before_step(update, policy)
        runs["ours bf16 before"] = lambda: ours(old, amp=True)
    times = {c: [] for c in columns}
    for round_ in range(args.steps + 1):
        for column in columns:
            seconds = runs[column]()
            if round_:
                times[column].append(seconds)
        if round_:
            print(f"round {round_}: " + ", ".join(f"{c} {times[c][-1]:.2f} s" for c in columns))
    peer.close()

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    rows = [
        {
            "column": c,
            "params_M": (
                peer.n_params if c.startswith("lerobot") else sum(p.numel() for p in policy.parameters())
            )
            / 1e6,
            "batch": batch_size,
            "s_per_step": statistics.median(times[c]),
            "lerobot_fp32_over_this": ratio("lerobot fp32", c),
            "lerobot_bf16_over_this": ratio("lerobot bf16", c),
            "runs_s": times[c],
        }
        for c in columns
    ]
    print_table(
        rows,
        ["column", "params_M", "batch", "s_per_step", "lerobot_fp32_over_this", "lerobot_bf16_over_this"],
    )
    path = save_results(
        f"peer_{'' if args.policy == 'diffusion' else 'act_'}{cpu_vendor(machine_info()['cpu'])}",
        rows,
        {"args": {**vars(args), "peer_python": str(args.peer_python)}},
    )
    print(f"wrote {path}; machine: {machine_info()}")


if __name__ == "__main__":
    main()
