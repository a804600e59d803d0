"""Data-parallel training and sharded evaluation on N processes, on torch.distributed.

Launch with `torchrun --nproc_per_node N scripts/train.py ...` (or `accelerate launch`, or `srun` with
torchrun on each node): the launcher sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
`MASTER_PORT`, and `init` joins the process group (`env://`; NCCL on GPUs, gloo on CPU). Without a launcher
every function here is the one-process case and costs nothing.

What makes N processes train exactly as one (docs/distributed.md):
- `training.batch_size` is the global batch; each process loads its contiguous slice (`shard_size`,
  `StepBatchSampler(shard=...)`), so the samples of a step are the same on any N.
- The trainer makes the per-sample random draws of each update (noise, timesteps, crops:
  `Policy.draw_training_noise`) for the global batch on every process from the same seeded stream and
  hands each process its rows in the batch. A policy never sees a process group: its loss is the plain
  mean over its own batch.
- Gradients are averaged by DDP (`wrap`). A loss that is the mean over a count that differs between the
  shards (e.g. real, unpadded actions) is weighed by `loss_weight` first, so the average of the processes'
  gradients is the gradient of the global batch's mean loss and every process applies the one-process
  update and holds the same weights.
Writing (checkpoints, metrics, plots, videos, wandb) happens on the main process only (`is_main`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lerobot.errors import ConfigError

T = TypeVar("T")

# Whether this module created the process group (and so destroys it in `shutdown`); a caller that set up
# its own group keeps it.
_owned = False
# A gloo group over the same processes when the default group is NCCL: host-side exchanges (flags, Python
# objects, barriers) go through it, so they never wait for the GPU's queued work.
_host_group: dist.ProcessGroup | None = None


def world_size() -> int:
    """Number of processes of the run: the process group's size, else what the launcher set (1 without)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's index in the run (0 without a launcher)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Whether this process writes the run's files (rank 0)."""
    return rank() == 0


def active() -> bool:
    """Whether a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init(device: torch.device) -> torch.device:
    """Join the process group the launcher described (no-op on one process); return this process's device.

    NCCL for CUDA devices (each process takes GPU `LOCAL_RANK`), gloo for the CPU.
    """
    global _owned, _host_group
    if world_size() <= 1:
        return device
    if device.type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"process {local_rank} of this node has no GPU of its own ({torch.cuda.device_count()} visible); "
                "launch at most one process per GPU (torchrun --nproc_per_node)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
        _owned = True
    if dist.get_backend() == "nccl" and _host_group is None:
        _host_group = dist.new_group(backend="gloo")
    return device


def shutdown() -> None:
    """Leave the process group if `init` created it."""
    global _owned, _host_group
    if _owned and dist.is_initialized():
        dist.destroy_process_group()
    _owned, _host_group = False, None


def shard_size(global_batch: int) -> int:
    """Samples per process of a global batch; a `ConfigError` when the processes cannot share it evenly."""
    n = world_size()
    if global_batch % n:
        raise ConfigError(
            f"training.batch_size={global_batch} is the global batch and must be divisible by the {n} "
            f"processes; pick a multiple of {n}"
        )
    return global_batch // n


def _sum_over_processes(x: Tensor) -> Tensor:
    total = x.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def loss_weight(count: Tensor) -> Tensor:
    """The factor that turns this process's mean loss over `count` elements into its share of the global
    batch's mean loss: `count * N / (count summed over the N processes)` (an all-reduce; 1 on one process).

    DDP averages the N processes' gradients, so weighed losses average to the global mean loss's gradient
    whatever each process's count, e.g. the real, unpadded actions of its shard. Not differentiable.
    """
    if not active():
        return torch.ones_like(count)
    return count.detach() * world_size() / _sum_over_processes(count).clamp_min(1.0)


def wrap(policy: nn.Module) -> nn.Module:
    """The module to run the training forward pass through: DDP around `policy` on N processes (gradients
    averaged during backward), `policy` itself on one."""
    if not active():
        return policy
    device = next(policy.parameters()).device
    return nn.parallel.DistributedDataParallel(
        policy,
        device_ids=[device] if device.type == "cuda" else None,
        # Buffers (normalization statistics) never change during training and are equal everywhere: no
        # broadcast before every forward pass.
        forward_sync_buffers=False,
    )


def mean(x: Tensor) -> Tensor:
    """`x` averaged over all processes (a new tensor; `x` itself on one process)."""
    if not active():
        return x
    return _sum_over_processes(x) / world_size()


def any_process(flag: bool) -> bool:
    """Whether `flag` is set on any process; every process gets the same answer (e.g. a stop signal that
    reached one of them, so that all stop at the same step)."""
    if not active():
        return flag
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=_host_group)
    return bool(value.item())


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on the main process only and give its result (or raise its exception) on every process.

    For work with side effects that must happen once, such as creating the run directory.
    """
    if not active():
        return fn()
    box: list[Any] = [None]
    if is_main():
        try:
            box[0] = (True, fn())
        except Exception as e:  # re-raised below, on every process
            box[0] = (False, e)
    dist.broadcast_object_list(box, src=0, group=_host_group)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def gather(obj: T) -> list[T]:
    """Every process's `obj`, in rank order, on every process."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj, group=_host_group)
    return out


def share(n: int) -> tuple[int, int]:
    """This process's contiguous share `[start, stop)` of `n` items (e.g. evaluation episodes); the first
    `n % N` processes take one more."""
    size, r = world_size(), rank()
    base, extra = divmod(n, size)
    start = r * base + min(r, extra)
    return start, start + base + (r < extra)


def barrier() -> None:
    """Wait until every process reaches this point."""
    if active():
        dist.barrier(group=_host_group)
