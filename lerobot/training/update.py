"""One gradient update, and what the offline and online trainers share around it.

`TrainStep` is the update (autocast, backward, clipping, optimizer, LR schedule, EMA) and its metrics
(`StepMetrics`: accumulated on the device, read at log time, where a non-finite loss stops the run). Its
`state_dict` is the part of a checkpoint's training state that both trainers share (weights, optimizer, LR
scheduler, EMA); each trainer adds its own counters, and `restore` loads a checkpoint's back.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from lerobot import distributed
from lerobot.checkpoints.run import load_training_state, read_weights
from lerobot.config import PolicyConfig
from lerobot.constants import LOSS_COUNT
from lerobot.errors import CheckpointError, TrainingDivergedError
from lerobot.policies.policy import Policy

log = logging.getLogger(__name__)


def build_optimizer(
    policy: Policy, policy_cfg: PolicyConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over `policy.optimizer_param_groups()` with the policy's optimizer settings as defaults, and a
    diffusers LR schedule (warm-up, then e.g. cosine) over `total_steps` updates."""
    from diffusers.optimization import get_scheduler

    # The fused kernel does AdamW's math in one pass over each tensor instead of a dozen elementwise ops,
    # which makes the optimizer step much faster for large models, on a CPU too. torch has it for CPU
    # and CUDA tensors; elsewhere (e.g. MPS on an older torch) the default implementation runs.
    device_types = {p.device.type for p in policy.parameters()}
    optimizer = torch.optim.AdamW(
        policy.optimizer_param_groups(),
        lr=policy_cfg.optimizer_lr,
        betas=tuple(policy_cfg.optimizer_betas),
        eps=policy_cfg.optimizer_eps,
        weight_decay=policy_cfg.optimizer_weight_decay,
        fused=device_types <= {"cpu", "cuda"} or None,
    )
    scheduler = get_scheduler(
        policy_cfg.scheduler_name,
        optimizer=optimizer,
        step_rules=policy_cfg.scheduler_step_rules,
        num_warmup_steps=policy_cfg.scheduler_warmup_steps,
        num_training_steps=max(total_steps, 1),
    )
    return optimizer, scheduler


class StepMetrics:
    """The scalar outputs of the updates since the last log, accumulated on the device.

    Reading a device value on the host waits for all the work queued before it (a host sync), so `add`
    reads nothing: it writes each update's loss into a device tensor (one slot per update, so that the first
    non-finite one can be named) and sums every scalar output into another. `pop`, at log time, copies both
    to the host in one transfer (the one sync of a log window), raises `TrainingDivergedError` naming the
    first update whose loss was NaN or infinite, and returns the means. `check_finite` does the same check
    without consuming the window (before a checkpoint is written).

    For a reduction across processes: `sums` (K,) holds the sums of `keys` over `count` updates, `losses`
    (capacity,) the losses of the updates in order, both on the training device.
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.sums: Tensor | None = None
        self.losses: Tensor | None = None
        self.where: list[str] = []  # the label of each update of the window, as given to `add`
        self.total = 0  # updates added since this object was made, windows before this one included
        self._checked = 0  # updates of the window already known to have a finite loss

    @property
    def count(self) -> int:
        """Updates accumulated since the last `pop`."""
        return len(self.where)

    def add(self, output: dict[str, Tensor], where: str) -> None:
        """Accumulate the scalars of one update's `output` (`loss` among them); `where` names the update in
        the divergence error (e.g. "step 12")."""
        scalars = {k: v for k, v in output.items() if v.numel() == 1}
        if not self.keys:
            self.keys = list(scalars)
        values = torch.stack([scalars[k].detach().reshape(()).float() for k in self.keys])
        n = self.count
        if self.sums is None:
            self.sums = torch.zeros_like(values)
            self.losses = values.new_zeros(64)
        elif n == self.losses.numel():  # grow by doubling: a window's update count is not fixed (online)
            self.losses = torch.cat([self.losses, torch.zeros_like(self.losses)])
        self.sums += values
        self.losses[n] = values[self.keys.index("loss")]
        self.where.append(where)
        self.total += 1

    def _host_values(self) -> tuple[list[float], list[float]]:
        """(sums, losses of this window) on the host, in one device-to-host copy."""
        n = self.count
        host = torch.cat([self.sums, self.losses[:n]]).cpu().tolist()
        return host[: len(self.keys)], host[len(self.keys) :]

    def _raise_if_diverged(self, losses: list[float]) -> None:
        for i in range(self._checked, len(losses)):
            if not math.isfinite(losses[i]):
                first_of_window = self.total - self.count
                raise TrainingDivergedError(
                    f"loss is {losses[i]} at {self.where[i]}; stopping", update=first_of_window + i + 1
                )
        self._checked = len(losses)

    def check_finite(self) -> None:
        """Raise `TrainingDivergedError` if an update since the last `pop` had a non-finite loss (one host
        sync, none when every update was already checked)."""
        if self.count > self._checked:
            self._raise_if_diverged(self._host_values()[1])

    def pop(self) -> dict[str, float]:
        """Means of the scalar outputs over the updates since the last `pop` ({} if none), after the
        divergence check; starts a new window."""
        if self.count == 0:
            return {}
        sums, losses = self._host_values()
        self._raise_if_diverged(losses)
        means = {k: v / self.count for k, v in zip(self.keys, sums)}
        self.sums.zero_()
        self.where, self._checked = [], 0
        return means


class TrainStep:
    """One gradient update of `policy`; owns the optimizer, the LR scheduler, the EMA weights and the
    update's metrics (`metrics`, a `StepMetrics`).

    The loss is computed under bf16 autocast when `training.use_amp` asks for it (true, or auto on a device
    with native bf16), by the compiled forward pass when `training.compile` is (`torch.compile`; the
    policy's own modules are untouched); gradients are clipped to `training.grad_clip_norm`; the EMA of the
    weights (when the policy config sets `use_ema`) steps after the optimizer. Nothing here waits for the
    device: a non-finite loss is found when `metrics` is read (at log time and before a checkpoint), which
    names the first update that had one.

    The per-sample random draws of the update (`Policy.draw_training_noise`) are made here and handed to
    the policy in the batch. On N processes (`distributed`) the batch is this process's shard of the global
    batch: every process draws for the whole global batch from the same seeded stream and keeps its rows,
    so a sample gets the draws it gets on one process. The forward pass runs through DDP, which averages
    the gradients over the processes; a policy that reports the count its loss averages over (`LOSS_COUNT`)
    has its loss weighed by its share of the global count first (`distributed.loss_weight`), so the
    averaged gradient is the global batch's mean loss's whatever the shards' counts. The loss recorded is
    the global batch's (an all-reduce queued on the device), so every process sees the same figures and
    stops on the same divergence.
    """

    def __init__(
        self, policy: Policy, policy_cfg: PolicyConfig, training_cfg: DictConfig, total_updates: int
    ):
        self.policy = policy
        self.model = distributed.wrap(policy)
        if training_cfg.compile:
            self.model = torch.compile(self.model)
        self.optimizer, self.scheduler = build_optimizer(policy, policy_cfg, total_updates)
        self.ema = None
        if policy_cfg.use_ema:
            from lerobot.training.ema import LerpEMA  # diffusers loads slowly: only when a policy uses EMA

            self.ema = LerpEMA(
                policy.parameters(),
                decay=policy_cfg.ema_max_decay,
                use_ema_warmup=True,
                power=policy_cfg.ema_power,
            )
        self.grad_clip_norm = training_cfg.grad_clip_norm
        self.params = list(policy.parameters())
        device = next(policy.parameters()).device
        self.device_type = device.type
        self.use_amp = distributed.resolve_amp(training_cfg.use_amp, device)
        self.metrics = StepMetrics()

    def __call__(self, batch: dict[str, Tensor], where: str) -> dict[str, Tensor]:
        """Update on `batch` (tensors `(B, ...)`, this process's samples; this process's rows of the random
        draws are added to it); return the policy's outputs (detached, `LOSS_COUNT` left out) and
        `grad_norm` (before clipping), all still on the device. They are also added to `metrics`, with
        `where` naming the update (e.g. "step 12") in the error raised there when its loss was NaN or
        infinite."""
        self.policy.train()
        batch = {**batch, **shard_training_noise(self.policy, next(iter(batch.values())).shape[0])}
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.use_amp):
            output = self.model(batch)
        count = output.get(LOSS_COUNT)
        output = {k: v for k, v in output.items() if k != LOSS_COUNT}
        loss = output["loss"]
        if count is not None and distributed.active():
            loss = loss * distributed.loss_weight(count)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.step(self.policy.parameters())
        output = {
            **{k: v.detach() for k, v in output.items()},
            "loss": distributed.mean(loss.detach()),
            "grad_norm": grad_norm,
        }
        self.metrics.add(output, where)
        return output

    def _clip_gradients(self) -> Tensor:
        """Clip the gradients to `grad_clip_norm`; return their norm before. With no limit (inf) only the norm
        is computed: the clip would multiply every gradient by 1, a pass over all of them for nothing."""
        if math.isinf(self.grad_clip_norm):
            grads = [p.grad for p in self.params if p.grad is not None]
            return torch.nn.utils.get_total_norm(grads)
        return torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip_norm)

    def advice(self) -> str:
        """What to change when this update diverges (gradients are already clipped, so not that)."""
        amp = "train in fp32 (training.use_amp=false), " if self.use_amp else ""
        return (
            f"the gradients were already clipped to training.grad_clip_norm={self.grad_clip_norm}: {amp}lower "
            f"the learning rate (policy.optimizer_lr, now {self.optimizer.defaults['lr']:g}) and check the "
            "dataset statistics (a feature with a near-zero std blows up its normalized values)"
        )

    @property
    def lr(self) -> float:
        """Learning rate of the first parameter group, as the scheduler last set it."""
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict[str, Any]:
        """The training state both trainers checkpoint: the raw weights (`model`; the EMA weights, when used,
        are `ema`), the optimizer and the LR scheduler (`scheduler`)."""
        return {
            "model": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], weights: dict[str, Tensor] | None = None) -> None:
        """Restore what `state_dict` returned into the policy and this update.

        The learning rates stay this update's own: a state saved with another `optimizer_lr` (a branch,
        `training.init_from`) has its current rate and the rest of its schedule scaled to it, group by group.
        Checkpoints of the online trainer written before both trainers shared this layout keep no `model`
        (their weights are `weights`, the checkpoint's `model.safetensors`) and name the scheduler
        `lr_scheduler`.
        """
        model = state.get("model")
        if model is None:
            if weights is None:
                raise ValueError("this training state holds no weights: pass the checkpoint's weights")
            model = weights
        try:
            self.policy.load_state_dict(model)
        except RuntimeError as e:
            raise CheckpointError(
                f"the checkpoint's weights do not fit this policy's config ({str(e).splitlines()[-1].strip()}); "
                "a run started from another run's checkpoint may change how it trains, not the model's shape"
            ) from None
        wanted = [group["initial_lr"] for group in self.optimizer.param_groups]
        saved_groups = len(state["optimizer"]["param_groups"])
        if saved_groups != len(wanted):
            raise CheckpointError(
                f"the checkpoint's optimizer has {saved_groups} parameter group(s), this config makes "
                f"{len(wanted)}: a setting that splits the parameters into groups changed (e.g. "
                "policy.encoder_lr_scale from 1 to another value); resume with the run's own value"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"] if "scheduler" in state else state["lr_scheduler"])
        for i, (group, lr) in enumerate(zip(self.optimizer.param_groups, wanted, strict=True)):
            if group["initial_lr"] != lr:
                group["lr"] *= lr / group["initial_lr"]
                group["initial_lr"] = self.scheduler.base_lrs[i] = lr
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])

    @contextlib.contextmanager
    def averaged_weights(self) -> Iterator[None]:
        """Swap the EMA weights into the policy for the duration (no-op without EMA): they are what is
        evaluated and saved as the checkpoint's model."""
        if self.ema is None:
            yield
            return
        self.ema.store(self.policy.parameters())
        self.ema.copy_to(self.policy.parameters())
        try:
            yield
        finally:
            self.ema.restore(self.policy.parameters())


def restore(ckpt_dir: Path, update: TrainStep) -> dict[str, Any]:
    """Load the checkpoint in `ckpt_dir` into `update` (weights, optimizer, LR schedule, EMA); return its
    training state, whose counters, random states and extras each trainer sets itself.

    Checkpoints of the online trainer written before both trainers shared this layout keep no raw weights
    in their training state: those are read from the checkpoint's `model.safetensors`.
    """
    state = load_training_state(ckpt_dir)
    update.load_state_dict(state, weights=None if "model" in state else read_weights(ckpt_dir)[0])
    return state


def shard_training_noise(policy: Policy, local_size: int) -> dict[str, Tensor]:
    """This process's rows of `policy`'s random draws for the global batch (`Policy.draw_training_noise`).

    On process r of N: rows `[r * b, (r + 1) * b)` of `draw_training_noise(b * N)`, `b = local_size` the
    samples of this process's batch; all the rows on one process. Every process draws for the whole global
    batch from the same seeded stream, so its sample gets the draws it gets on one process and the random
    streams advance as they do there.
    """
    start = distributed.rank() * local_size
    draws = policy.draw_training_noise(local_size * distributed.world_size())
    return {k: v[start : start + local_size] for k, v in draws.items()}


def to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """`batch` with every tensor on `device`. To CUDA the copies are asynchronous: from pinned (page-locked)
    host memory, pinning first what is not pinned yet (a copy from pageable memory would wait)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {
        k: (v if v.is_pinned() else v.pin_memory()).to(device, non_blocking=True) for k, v in batch.items()
    }


def nothing_to_train(step: int, total: int) -> bool:
    """Whether a resumed run already stands past `training.steps` (`total`); if so, says so in one line
    (nothing is trained, and the command ends as a finished run does)."""
    if step <= total:
        return False
    log.warning(
        "the run stands at step %d, past training.steps=%d: nothing to train (raise training.steps above %d to "
        "continue it)",
        step,
        total,
        step,
    )
    return True
