"""The processes of a run: the device each uses (`resolve_device`), and data-parallel training and sharded
evaluation on N of them, on torch.distributed (their random states: `lerobot.random_state`).

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

When a process fails or stops answering (docs/distributed.md, "When a process fails or hangs"): one that fails
leaves word in the launcher's store before it goes (`report_failure`); the others' collectives then fail
(gloo raises once the peer's connections close) or time out, and `peer_failure` tells each of them which
process failed, or which ones did not answer. Collectives wait `LONG_TIMEOUT` where waiting minutes is
normal (start-up, evaluation, the step after a checkpoint) and the training step's timeout otherwise
(`set_collective_timeout`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lerobot.errors import ConfigError

T = TypeVar("T")

log = logging.getLogger(__name__)

# Whether this module created the process group (and so destroys it in `shutdown`); a caller that set up
# its own group keeps it.
_owned = False
# A gloo group over the same processes when the default group is NCCL: host-side exchanges (flags, Python
# objects, barriers) go through it, so they never wait for the GPU's queued work.
_host_group: dist.ProcessGroup | None = None
# The store of the process group (the launcher's, or process 0's), where a failing process leaves word.
_store: dist.Store | None = None

# How long a collective waits for the other processes where waiting minutes is normal: at start-up (process 0
# creates the run directory and converts the data while the others wait; a first compile), in an evaluation
# (the merge waits for the slowest process's episodes) and in the step after a checkpoint (process 0 writes
# it while the others go on). Torch's own default for gloo; the other training steps wait
# `training.collective_timeout_s` (`set_collective_timeout`).
LONG_TIMEOUT = dt.timedelta(minutes=30)
# How long a process whose collective failed waits for the others' word before it names the missing ones.
REPORT_WAIT_S = 10.0
# Each store operation of a report: the store's host (the launcher, or process 0) may be gone or stopped too.
_STORE_TIMEOUT = dt.timedelta(seconds=5)
_FAILURE_KEY = "lerobot/failure"
_PRESENT_KEY = "lerobot/present/{}"
# How gloo's errors (plain RuntimeErrors) read when a peer's connection closed or a wait timed out.
_GLOO_FAILURE = re.compile(r"gloo/transport|Connection (closed|reset) by peer|Timed out waiting")
# The timeout of the host-side collectives in effect, and whether it is the training step's.
_timeout_s = LONG_TIMEOUT.total_seconds()
_step_timeout = False


def auto_device() -> str:
    """What `device=auto` picks on this machine: `cuda` when a GPU is present, else `mps` (Apple GPU) where
    available, else `cpu`; nothing is set up."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name: str) -> torch.device:
    """The torch device that `device=<name>` asks for (see `RootConfig.device`), set up for use.

    `auto` picks CUDA when a GPU is present, else MPS (Apple GPU) where available, else the CPU. A named device
    that this machine lacks (`cuda` without a GPU, `cuda:1` with one GPU, `mps` off a Mac) is a config error.
    On CUDA, float32 matmuls and convolutions use TF32 (bf16 autocast is `training.use_amp`).
    """
    if name == "auto":
        name = auto_device()
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA GPU(s) (cuda:0..cuda:{count - 1})" if count else "no CUDA GPU"
            raise ConfigError(f"device={name} but this machine has {have}; use device=auto or device=cpu")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device={name} but MPS (Apple GPU) is not available here; use device=auto or device=cpu"
        )
    log.info("device: %s", describe_device(device))
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 matmuls and convolutions on kernels of their own: any GPU, and a CPU whose
    oneDNN has bf16 kernels (AVX-512 or AMX). A CPU with AVX2 alone emulates them, 4x (a Linear) to 25x (a
    Conv2d) slower than float32 (docs/benchmarks.md), so there bf16 autocast and `inference.dtype=bfloat16`
    are slow paths."""
    if device.type != "cpu":
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_amp(setting: bool | str, device: torch.device) -> bool:
    """`training.use_amp` (true, false or auto) as a decision for `device`: auto is bf16 autocast where the
    device has native bf16 (`native_bf16`) and float32 elsewhere; true on a device without it warns."""
    setting = str(setting).lower()
    if setting == "auto":
        use = native_bf16(device)
        log.info(
            "training.use_amp=auto: %s",
            "bf16 autocast" if use else "float32 (this CPU has no native bf16 kernels)",
        )
        return use
    if setting == "true":
        warn_if_bf16_is_slow(device, "training.use_amp=true", "training.use_amp=auto (or false)")
        return True
    return False


def warn_if_bf16_is_slow(device: torch.device, setting: str, fix: str) -> None:
    """Log one warning when `setting` asks for bf16 on a `device` without native bf16 (`native_bf16`),
    naming `fix`."""
    if native_bf16(device):
        return
    log.warning(
        "%s on a CPU without native bf16 kernels (it has neither AVX-512 nor AMX): bf16 runs several times "
        "slower than float32 here; set %s",
        setting,
        fix,
    )


def describe_device(device: torch.device) -> str:
    """`device` as the start-up line shows it, e.g. `cuda:0 (NVIDIA H200)` or `cpu (2 threads)`."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)}, TF32 matmuls)"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


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

    NCCL for CUDA devices (each process takes GPU `LOCAL_RANK`), gloo for the CPU. Gloo's collectives wait
    up to `LONG_TIMEOUT` for the other processes until the training loop sets the step's timeout; NCCL keeps
    its own (10 minutes, enforced by its watchdog).
    """
    global _owned, _host_group, _store, _timeout_s
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
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = LONG_TIMEOUT if backend == "gloo" else None
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
        _owned = True
    if dist.get_backend() == "nccl" and _host_group is None:
        _host_group = dist.new_group(backend="gloo", timeout=LONG_TIMEOUT)
    _store = dist.distributed_c10d._get_default_store()
    _timeout_s = LONG_TIMEOUT.total_seconds()
    return device


def shutdown() -> None:
    """Leave the process group if `init` created it."""
    global _owned, _host_group, _store, _timeout_s, _step_timeout
    if _owned and dist.is_initialized():
        dist.destroy_process_group()
    _owned, _host_group, _store = False, None, None
    _timeout_s, _step_timeout = LONG_TIMEOUT.total_seconds(), False


def set_collective_timeout(seconds: float | None) -> None:
    """Make the host-side collectives from now on fail after waiting `seconds` for the other processes (the
    training step's timeout, `training.collective_timeout_s`), or `LONG_TIMEOUT` for None.

    A local setting (no exchange; applied when it changes). It bounds gloo's collectives: on the CPU all of
    them, on GPUs the host-side exchanges such as the stop signals of every step (`stop_signals`).
    """
    global _timeout_s, _step_timeout
    if not active():
        return
    target = LONG_TIMEOUT.total_seconds() if seconds is None else float(seconds)
    if target != _timeout_s:
        dist.set_timeout(dt.timedelta(seconds=target), group=_host_group)
        _timeout_s = target
    _step_timeout = seconds is not None


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


def stop_signals(signum: int | None) -> dict[int, int]:
    """The stop signals the processes have received, `{rank: signal number}` for those that received one; the
    same on every process (so that all stop at the step where any of them got one, and can say which).

    One all-gather of one number per process, over the host group, so it never waits for queued GPU work. On
    one process `{0: signum}`, or `{}`.
    """
    if not active():
        return {} if signum is None else {rank(): signum}
    mine = torch.tensor([signum or 0])
    values = [torch.zeros_like(mine) for _ in range(world_size())]
    dist.all_gather(values, mine, group=_host_group)
    return {r: int(value) for r, value in enumerate(values) if int(value)}


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
        if not is_main():
            with contextlib.suppress(AttributeError):  # an exception type without attributes of its own
                value.lerobot_raised_on_main = True  # see `raised_on_main`
        raise value
    return value


def raised_on_main(error: BaseException) -> bool:
    """Whether `error` is the main process's, raised on this one by `on_main`: every process raises it, and
    the main one reports it."""
    return getattr(error, "lerobot_raised_on_main", False)


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


def report_failure(what: str) -> None:
    """Leave word in the launcher's store that this process fails, before it leaves the process group.

    `what` says how, e.g. "failed: <the error's message>". The other processes' collectives fail once this one
    has gone; `peer_failure` then names this process there and says `what`. The first report of a run stays.
    A no-op on one process, or when the store does not answer.
    """
    # DistStoreError (a RuntimeError): the store's host is gone or stopped.
    with contextlib.suppress(RuntimeError, ValueError):
        if active():
            _post({"ranks": [rank()], "what": what, "by": rank()})


def peer_failure(error: BaseException) -> str | None:
    """Why this process stops, when `error` comes from another process: a phrase that names the process(es)
    that failed or did not answer; None when it does not (a failure of this process's own, or one process).

    `error` is a collective's failure (a peer's connection closed, or the wait timed out), or a stop signal,
    possibly raised while such a failure unwound the stack (torchrun sends SIGTERM to every process once one
    has ended). The report a failed process left (`report_failure`) says who and why. Without one, this
    process waits up to `REPORT_WAIT_S` for the others whose collectives failed too, names those that did not
    show up, and leaves that as the report: a stopped process that is continued later learns why the others
    left.
    """
    cause = _collective_error(error)
    if _store is None or not active():
        return None
    try:
        report = _reported()
        if report is None and cause is not None:
            report = _report_missing(cause)
    except (RuntimeError, ValueError):  # DistStoreError: the store's host is gone or stopped too
        report = None
    if report is not None:
        return _describe(report)
    if cause is None:
        return None  # a stop signal that no failure explains
    return (
        f"stopped because a collective failed ({_first_sentence(cause)}): another process ended or stopped "
        "answering; its own output says which"
    )


def _collective_error(error: BaseException | None) -> BaseException | None:
    """The failed collective's error among `error` and the exceptions it interrupted (`__context__`)."""
    while error is not None:
        if isinstance(error, dist.DistError):
            return error
        if isinstance(error, RuntimeError) and _GLOO_FAILURE.search(str(error)):
            return error
        error = error.__context__
    return None


def _post(report: dict[str, Any]) -> dict[str, Any]:
    """Store `report` as the run's failure unless there is one already; return the one stored."""
    _store.set_timeout(_STORE_TIMEOUT)
    return json.loads(_store.compare_set(_FAILURE_KEY, "", json.dumps(report)))


def _reported() -> dict[str, Any] | None:
    """The run's failure report, if a process left one."""
    _store.set_timeout(_STORE_TIMEOUT)
    return json.loads(_store.get(_FAILURE_KEY)) if _store.check([_FAILURE_KEY]) else None


def _report_missing(cause: BaseException) -> dict[str, Any] | None:
    """Say in the store that this process is here, wait up to `REPORT_WAIT_S` for the others (or a report),
    and report the processes that did not show up; None when all did."""
    keys = [_PRESENT_KEY.format(r) for r in range(world_size())]
    _store.set(keys[rank()], "1")
    deadline = time.monotonic() + REPORT_WAIT_S
    while True:
        report = _reported()
        if report is not None:
            return report
        present = {r for r, key in enumerate(keys) if _store.check([key])}
        if len(present) == len(keys) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    missing = [r for r in range(len(keys)) if r not in present]
    if not missing:
        return None
    if "Timed out" in str(cause):
        setting = " (training.collective_timeout_s)" if _step_timeout else ""
        what = f"did not answer within {_timeout_s:g} s{setting}"
    else:
        what = "ended without a word (killed, or crashed: see its output)"
    return _post({"ranks": missing, "what": what, "by": rank()})


def _describe(report: dict[str, Any]) -> str:
    """A failure report in words, as this process sees it."""
    ranks, what = report["ranks"], report["what"]
    if rank() in ranks:
        return f"stopped because rank {report['by']} gave up waiting for this process: it {what}"
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return f"stopped because {who} {what}"


def _first_sentence(error: BaseException) -> str:
    """The first sentence of a collective's error, without gloo's source location (`[.../pair.cc:561]`)."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip())
    return text.split(". ")[0].splitlines()[0] if text else type(error).__name__
