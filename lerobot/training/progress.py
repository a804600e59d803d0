"""The progress of a training run, shared by both trainers: the step counter (gradient steps offline, env
transitions online), the progress bar, the metrics log, stop signals, and when logging, checkpointing and
evaluation are due. A trainer writes its own work between two `advance` calls:

    with TrainingLoop(cfg, run_dir.path, start=step, resumed=...) as loop:
        while loop.running:
            ...                                  # offline: a batch, one update; online: collect, n updates
            due = loop.advance(n)                # n = steps this iteration counts
            if due.log: loop.log(update.metrics.pop() | ...)   # the window's one host sync
            if due.checkpoint: update.metrics.check_finite(); run_dir.save(...)
            if due.eval: loop.evaluate(policy)

Each of the three is due when the counter crosses a multiple of its period (`training.log_freq`,
`training.save_freq`, `eval.freq`; 0 disables evaluation) and after the last iteration. A stop signal
(`lerobot.runtime.signals`) makes the current iteration the last: logging and a checkpoint are due, evaluation
is not. A stop signal during an evaluation abandons it (its partial `eval/step_N/` is removed) and makes this
step the last (`eval_abandoned`): the trainer saves the checkpoint of this step if it has not, so that the
resumed run redoes the evaluation. A resumed run whose first step's evaluation was due but never recorded
(the process died or was stopped while evaluating) has `eval_pending` set: the trainer evaluates before its
first iteration.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from tqdm.auto import tqdm

from lerobot import distributed, random_state
from lerobot.evaluation import evaluate
from lerobot.policies.policy import Policy
from lerobot.runtime.signals import EvaluationInterrupted, active
from lerobot.training.metrics import MetricsLogger

log = logging.getLogger(__name__)


def _crossed(before: int, after: int, every: int) -> bool:
    """Whether a multiple of `every` lies in (before, after]; never for `every` <= 0."""
    return every > 0 and after // every > before // every


@dataclass(frozen=True)
class Due:
    """What is due after an iteration of a trainer's loop."""

    log: bool
    checkpoint: bool
    eval: bool


class TrainingLoop:
    """Progress of a training run from `start` to `training.steps`, its progress bar and its metrics log.

    A context manager: leaving it closes the progress bar and the logger (final curves, wandb). Inside it,
    stop signals are recorded rather than fatal (`stop_requested`). On N processes only the main one has a
    logger and a progress bar; every process keeps the count, and a stop signal that reached any of them
    stops all of them at the same step.
    """

    def __init__(
        self, cfg: DictConfig, run_dir: Path, start: int, resumed: bool, unit: str, progress: bool = True
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.step = start
        self.total = cfg.training.steps
        # Read once: `advance` runs after every collection, and a config lookup costs microseconds each.
        self._log_freq, self._save_freq = cfg.training.log_freq, cfg.training.save_freq
        self._eval_freq, self._collective_timeout_s = cfg.eval.freq, cfg.training.collective_timeout_s
        # Records after the step this run starts from belong to an interrupted run (or, at 0, to one that
        # never saved a checkpoint): dropped, so that the file holds one trajectory. The main process keeps
        # the log; whether an evaluation is pending is its answer, for every process.
        main = distributed.is_main()
        self.logger = MetricsLogger(run_dir, cfg, resume_step=start) if main else None
        freq = cfg.eval.freq
        self.eval_pending = distributed.on_main(
            lambda: (
                resumed
                and freq > 0
                and (start % freq == 0 or start == self.total)
                and not any(r["step"] == start and r["split"] == "eval" for r in self.logger.records)
            )
        )
        self._stop = active()
        self._armed = self._stop.armed() if self._stop is not None else contextlib.nullcontext()
        self._stopping = False
        self.eval_abandoned = False  # a stop signal ended an evaluation of the current step
        self._bar = tqdm(
            total=self.total,
            initial=start,
            unit=unit,
            desc="train",
            disable=not (progress and main),
            dynamic_ncols=True,
        )

    def __enter__(self) -> TrainingLoop:
        self._armed.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None and self._stopping and self._stop is not None and self._stop.stop_signum:
            # A signal sent to every process (torchrun forwards its own to each worker in turn) may reach
            # one after the step's exchange; asked again once the checkpoint is written, the stop line
            # names every process that got it.
            received = distributed.stop_signals(self._stop.signum)
            receivers = sorted(r for r, s in received.items() if s == self._stop.stop_signum)
            self._stop.stopped(self._stop.stopped_at, self._stop.stop_signum, receivers)
        self._armed.__exit__(exc_type, *exc)
        self._bar.close()
        if self.logger is not None:
            self.logger.close()

    @property
    def stop_requested(self) -> bool:
        """Whether a stop signal has arrived (set asynchronously; `advance` acts on it at a step boundary)."""
        return self._stop is not None and self._stop.signum is not None

    @property
    def running(self) -> bool:
        """Whether the run has steps left and has not been asked to stop."""
        return self.step < self.total and not self._stopping

    def advance(self, n: int) -> Due:
        """Count `n` more steps; say whether logging, checkpointing and evaluation are due now."""
        before, self.step = self.step, self.step + n
        self._bar.update(n)
        # The one place the stop request is read, so that the step that saves is a step boundary. On N
        # processes a signal that reached any of them stops all at this step: they exchange the signal each
        # received (one number each per step) and stop for the lowest rank's.
        received = distributed.stop_signals(self._stop.signum if self._stop is not None else None)
        if received:
            self._stopping = True
            signum = received[min(received)]
            received_by = [r for r, s in sorted(received.items()) if s == signum]
            by = ""
            if self._stop is not None:
                self._stop.stopped(self.step, signum, received_by)
                by = self._stop.received_by_text(distributed.world_size())
            log.warning(
                "stopping at step %d for %s%s: saving a checkpoint",
                self.step,
                signal.Signals(signum).name,
                by,
            )
        last = not self.running
        due = Due(
            log=last or _crossed(before, self.step, self._log_freq),
            checkpoint=last or _crossed(before, self.step, self._save_freq),
            eval=self._eval_freq > 0
            and not self._stopping
            and (last or _crossed(before, self.step, self._eval_freq)),
        )
        # The next step's collectives fail after `training.collective_timeout_s` without the other processes
        # (docs/distributed.md); after a checkpoint or an evaluation, which the main process writes while the
        # others go on, they wait as long as at start-up.
        timeout = None if due.checkpoint or due.eval else self._collective_timeout_s
        distributed.set_collective_timeout(timeout)
        return due

    def log(self, metrics: dict[str, float]) -> None:
        """Record training metrics at the current step and show the loss on the progress bar (main process)."""
        if self.logger is None:
            return
        self.logger.log(self.step, metrics)
        shown = {k: f"{metrics[k]:.4g}" for k in ("loss", "episode_return") if k in metrics}
        if shown:
            self._bar.set_postfix(shown)

    def evaluate(self, policy: Policy) -> dict[str, Any] | None:
        """Evaluate `policy` now, into `run_dir/eval/step_<step>/`, and log the aggregated results.

        Random states are saved and restored around the rollouts so that evaluating does not change the
        training trajectory (a resumed run stays identical to an uninterrupted one). A stop signal abandons
        the evaluation on one process: nothing is logged, what it wrote is removed, the run stops at this
        step (`eval_abandoned`) and None is returned. On N processes, which must meet to merge their episodes,
        the evaluation ends first and the run stops at the next step boundary. Every process runs its share
        of the episodes; the main one writes and logs the merged results. What an interrupted run left in
        this step's directory is removed first.
        """
        out_dir = self.run_dir / "eval" / f"step_{self.step:09d}"
        if distributed.is_main() and out_dir.exists():
            shutil.rmtree(out_dir)
            log.info("removed %s, left by an evaluation that did not finish", out_dir)
        rng = random_state.get_rng_state()
        was_training = policy.training
        self.eval_pending = False
        try:
            interruptible = self._stop is not None and not distributed.active()
            with self._stop.evaluating() if interruptible else contextlib.nullcontext():
                info = evaluate(self.cfg, policy, out_dir)
        except EvaluationInterrupted:
            shutil.rmtree(out_dir, ignore_errors=True)
            self._stopping = self.eval_abandoned = True
            self._stop.stopped(self.step, self._stop.signum, [distributed.rank()])
            log.warning(
                "evaluation at step %d abandoned for %s: stopping at this step with its checkpoint; the "
                "resumed run redoes the evaluation",
                self.step,
                self._stop.name,
            )
            return None
        finally:
            policy.train(was_training)
            random_state.set_rng_state(rng)
        if self.logger is None:
            return info
        agg = info["aggregated"]
        log.info(
            "eval at step %d: pc_success=%.1f avg_max_reward=%.3f avg_sum_reward=%.2f",
            self.step,
            agg["pc_success"],
            agg["avg_max_reward"],
            agg["avg_sum_reward"],
        )
        # A multi-task evaluation's per-task success joins the curves as `pc_success/<task>`.
        per_task = {f"pc_success/{task}": f["pc_success"] for task, f in agg.get("per_task", {}).items()}
        figures = {k: v for k, v in agg.items() if k != "per_task"}
        self.logger.log(self.step, {**figures, **per_task}, split="eval")
        for path in info["video_paths"][:1]:
            self.logger.log_video(self.step, path)
        return info
