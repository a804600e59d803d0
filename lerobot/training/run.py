"""A training run, shared by both trainers: its directory (made or found, locked, and whether it resumes),
its progress (`TrainingLoop`: the counter, the bar, the metrics log, stop signals, what is due), and
what is kept when it diverges (`DivergenceGuard`).

## The directory

The resume decision (`training.resume`): `auto` resumes from `checkpoints/last` when the directory holds one
and starts fresh otherwise, so relaunching the same command after a preemption continues the run; `true`
requires a checkpoint; `false` refuses a directory that holds one. A resumed run must have the config it was
started with, except for the keys of `RESUMABLE_CHANGES`, and the data it was trained on
(`check_training_data`), unless `training.allow_other_data=true`. A new run may start from another run's
checkpoint under a changed config (`training.init_from`, `branch_checkpoint`): a branch.

## The progress

The step counter (gradient steps offline, env transitions online), the progress bar, the metrics log, stop
signals, and when logging, checkpointing and evaluation are due. A trainer writes its own work between two `advance` calls:

    with TrainingLoop(cfg, run_dir, start=step, resumed=...) as loop:
        while loop.running:
            ...                                  # offline: a batch, one update; online: collect, n updates
            due = loop.advance(n)                # n = steps this iteration counts
            if due.log: loop.log(update.metrics.pop() | ...)   # the window's one host sync
            if due.checkpoint: update.metrics.check_finite(); save_checkpoint(...)
            if due.eval: loop.evaluate(policy)

Each of the three is due when the counter crosses a multiple of its period (`training.log_freq`,
`training.save_freq`, `eval.freq`; 0 disables evaluation) and after the last iteration. A stop signal
(`lerobot.runtime.signals`) makes the current iteration the last: logging and a checkpoint are due, evaluation
is not. A resumed run whose first step's evaluation was due but never recorded (the process died while
evaluating) has `eval_pending` set: the trainer evaluates before its first iteration.

## When training diverges

The last checkpoint whose weights are good is kept, and named. A checkpoint's weights are good once a finite
loss has been computed on them. When the loss becomes NaN or infinite, the weights that gave it are those
before the update that computed it (the trainers find it at log time, `StepMetrics`, which names that
update); if they were saved, that checkpoint is not good, and `checkpoints/last` is moved back to the newest
earlier one (the diverged checkpoint stays on disk for inspection; a resumed run overwrites it). Non-finite
weights are never saved (`save_checkpoint` refuses them), so every checkpoint left is finite.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lerobot import distributed
from lerobot.checkpoints.run import (
    TRAINING_STATE_FILE,
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    load_config,
    read_data_fingerprint,
    remove_stale_temporaries,
    resolve_checkpoint_dir,
    set_last,
)
from lerobot.errors import (
    CheckpointError,
    ConfigError,
    NonFiniteWeightsError,
    RunDirError,
    TrainingDivergedError,
)
from lerobot.evaluation import evaluate
from lerobot.policies.policy import Policy
from lerobot.runtime.files import append_line, atomic_write, lock_run_dir, release_run_dir, write_text
from lerobot.runtime.signals import EvaluationInterrupted, active

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
# Curves drawn in the PNG: (split, key, panel title).
PLOTTED = (
    ("train", "loss", "train loss"),
    ("eval", "pc_success", "eval success (%)"),
    ("eval", "avg_max_reward", "eval avg max reward"),
)

# Keys that may differ between a checkpoint's config and the launch that resumes it (a prefix ending in "."
# stands for the whole section): the step budget (extending a run; the LR schedule of the remaining steps then
# follows the new total), how often to log/save/evaluate and how evaluation runs, logging, the device, how
# long processes wait for each other, data loading workers, where the run and its data live (the data itself
# is compared by its fingerprint, `check_training_data`, which `training.allow_other_data` waives), and the
# evaluation-only inference layer. Everything else shapes the trajectory of training, so a change there is a
# different run.
RESUMABLE_CHANGES = (
    "training.steps",
    "training.resume",
    "training.log_freq",
    "training.save_freq",
    "training.num_workers",
    "training.save_buffer",
    "training.use_async_envs",
    "training.compile",
    "training.collective_timeout_s",
    "training.allow_other_data",
    "eval.",
    "wandb.",
    "device",
    "output_dir",
    "job_name",
    "dataset.root",
    "dataset.cache_dir",
    "inference.",
)


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The checkpoint this launch continues from (None: a fresh run), per `training.resume`.

    Raises `RunDirError` when the checkpoint's config differs from `cfg` in a key outside
    `RESUMABLE_CHANGES`, and when `resume` is `true` without a checkpoint or `false` with one.
    """
    mode = str(cfg.training.resume)
    last = latest_checkpoint(run_dir)
    if mode == "false":
        if last is not None:
            raise RunDirError(
                f"{run_dir} already holds checkpoints and training.resume=false; pass training.resume=auto "
                "to continue it or pick another output_dir"
            )
        return None
    if last is None:
        if mode == "true":
            raise RunDirError(f"training.resume=true but {run_dir} holds no checkpoint (checkpoints/last)")
        return branch_checkpoint(cfg)
    changed = config_changes(load_config(last), cfg)
    if changed:
        shown = describe_changes(changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise RunDirError(
            f"{run_dir} holds a run with another config: {shown}{more}; relaunch with the run's settings "
            "to resume it, or pick another output_dir for a new run"
        )
    return last


def branch_checkpoint(cfg: DictConfig) -> Path | None:
    """The checkpoint a new run starts from (`training.init_from`: a run directory, for its last checkpoint,
    or one checkpoint directory); None when it is not set.

    The new run's config may differ from the checkpoint's in anything but the model's shape (the weights
    must load, `TrainStep.load_state_dict`); the differences are logged. Raises `RunDirError` when the path
    holds no checkpoint.
    """
    if cfg.training.init_from is None:
        return None
    source = cfg.training.init_from
    try:
        ckpt = resolve_checkpoint_dir(source)
        reason = None if (ckpt / TRAINING_STATE_FILE).is_file() else f"{ckpt} holds no {TRAINING_STATE_FILE}"
    except CheckpointError as e:
        reason = str(e)
    if reason is not None:
        raise RunDirError(
            f"training.init_from={source} is neither a run directory with a checkpoint nor a checkpoint "
            f"directory ({reason}); point it at the run or training checkpoint to start from"
        )
    changed = [c for c in config_changes(load_config(ckpt), cfg) if c[0] != "training.init_from"]
    log.info("branching from %s; config changes: %s", ckpt, describe_changes(changed) or "none")
    return ckpt


def describe_changes(changed: list[tuple[str, Any, Any]]) -> str:
    """`config_changes` output as one line: `key (saved -> current), ...`."""
    return ", ".join(f"{k} ({a!r} -> {b!r})" for k, a, b in changed)


# The fields of a data fingerprint (`lerobot.datasets.dataset_fingerprint`) that tell one dataset from
# another; `source` (where it was read) only helps the message: the same data moved elsewhere is the same.
FINGERPRINT_KEYS = ("format", "episodes", "frames", "sha256")


def check_training_data(ckpt_dir: Path, current: dict[str, Any] | None, cfg: DictConfig) -> None:
    """Raise `RunDirError` when the run resumed from `ckpt_dir` was trained on other data than `current`.

    `current` is the fingerprint of the data this launch reads (None: it reads none). A checkpoint that
    records no fingerprint (saved before checkpoints recorded one) resumes as before, unchecked. With
    `training.allow_other_data=true` a mismatch is a warning and the run goes on with the new data (and the
    checkpoint's normalization statistics); its next checkpoints record the new fingerprint.
    """
    if current is None:
        return
    saved = read_data_fingerprint(ckpt_dir)
    if saved is None:
        log.info(
            "%s records no fingerprint of its training data (an older checkpoint): not compared", ckpt_dir
        )
        return
    if all(saved.get(k) == current.get(k) for k in FINGERPRINT_KEYS):
        return
    run_dir = Path(ckpt_dir).parent.parent
    both = (
        f"checkpoint {Path(ckpt_dir).name} was trained on {describe_data(saved)}, "
        f"this launch reads {describe_data(current)}"
    )
    if cfg.training.allow_other_data:
        log.warning("resuming %s on other data (training.allow_other_data=true): %s", run_dir, both)
        return
    raise RunDirError(
        f"{run_dir} holds a run trained on other data: {both}; point dataset.root (or dataset.repo_id) at "
        "the run's data to resume it, pass training.allow_other_data=true to go on with this data (keeping "
        "the checkpoint's normalization statistics), or pick another output_dir for a new run"
    )


def describe_data(fingerprint: dict[str, Any]) -> str:
    """A fingerprint in words: `206 episodes, 25650 frames (pusht_zarr, sha256 1a2b3c4d5e6f) from PATH`."""
    return (
        f"{fingerprint.get('episodes')} episodes, {fingerprint.get('frames')} frames "
        f"({fingerprint.get('format')}, sha256 {str(fingerprint.get('sha256'))[:12]}) "
        f"from {fingerprint.get('source', '?')}"
    )


def config_changes(saved: DictConfig, current: DictConfig) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for every dotted key whose value differs, outside `RESUMABLE_CHANGES`."""
    a = _flatten(OmegaConf.to_container(saved, resolve=True))
    b = _flatten(OmegaConf.to_container(current, resolve=True))
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not _resumable(k)]


def _resumable(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as `{dotted.key: leaf}`; lists are leaves (compared whole)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, dict) and v else f"{prefix}{k}"))
    return out


def setup_run(cfg: DictConfig) -> tuple[Path, Path | None]:
    """Create (or find) the run directory and lock it; return it and the checkpoint to resume from, if any.

    Without `output_dir` a new, timestamped directory is made (so nothing is resumed automatically). The
    lock (`lerobot.runtime.files`) is taken before anything is read or written (stale checkpoint
    temporaries are cleared under it), and released when `lerobot.training.train` returns; `training.resume`
    decides between resuming and a fresh start.
    """
    if cfg.output_dir is None:
        if cfg.training.resume == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        now = dt.datetime.now()
        cfg.output_dir = str(
            Path("outputs/train")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{cfg.env.name}_{cfg.policy.name}"
        )
    run_dir = Path(cfg.output_dir)
    lock_run_dir(run_dir)
    try:
        # Before looking for checkpoints: a complete temporary may be put in place.
        remove_stale_temporaries(run_dir)
        resume_from = resume_checkpoint(cfg, run_dir)
    except BaseException:
        release_run_dir(run_dir)
        raise
    if resume_from is None:
        start = "new run"
    elif resume_from.parent.parent == run_dir:
        start = f"resuming from {resume_from.name}"
    else:
        start = f"a new run from {resume_from}"
    log.info("run directory: %s (%s)", run_dir, start)
    return run_dir, resume_from


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
            log=last or _crossed(before, self.step, self.cfg.training.log_freq),
            checkpoint=last or _crossed(before, self.step, self.cfg.training.save_freq),
            eval=self.cfg.eval.freq > 0
            and not self._stopping
            and (last or _crossed(before, self.step, self.cfg.eval.freq)),
        )
        # The next step's collectives fail after `training.collective_timeout_s` without the other processes
        # (docs/distributed.md); after a checkpoint or an evaluation, which the main process writes while the
        # others go on, they wait as long as at start-up.
        timeout = None if due.checkpoint or due.eval else self.cfg.training.collective_timeout_s
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
        the evaluation on one process (nothing is logged, None is returned); on N processes, which must meet
        to merge their episodes, it ends first and the run stops at the next step boundary. Every process
        runs its share of the episodes; the main one writes and logs the merged results.
        """
        rng = distributed.get_rng_state()
        was_training = policy.training
        self.eval_pending = False
        try:
            interruptible = self._stop is not None and not distributed.active()
            with self._stop.evaluating() if interruptible else contextlib.nullcontext():
                info = evaluate(self.cfg, policy, self.run_dir / "eval" / f"step_{self.step:09d}")
        except EvaluationInterrupted:
            log.warning("evaluation at step %d abandoned for %s", self.step, self._stop.name)
            return None
        finally:
            policy.train(was_training)
            distributed.set_rng_state(rng)
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
        self.logger.log(self.step, agg, split="eval")
        for path in info["video_paths"][:1]:
            self.logger.log_video(self.step, path)
        return info


class DivergenceGuard:
    """Context manager around a trainer's loop that turns a diverged loss or non-finite weights into one
    `TrainingDivergedError` naming the last good checkpoint (and moving `last` back to it when needed).

    The trainer calls `updated()` after each gradient update and `saved(step)` after each checkpoint.
    """

    def __init__(self, run_dir: Path, advice: str):
        """`advice`: what to change before training again (see `TrainStep.advice`)."""
        self.run_dir = Path(run_dir)
        self.advice = advice
        self.updates = 0  # gradient updates made in this process
        self._saved: tuple[int, int] | None = None  # (step, updates made before it) of the last checkpoint

    def updated(self) -> None:
        """The weights changed."""
        self.updates += 1

    def saved(self, step: int) -> None:
        """Checkpoint `step` now holds the current weights."""
        self._saved = (step, self.updates)

    def _diverged_step(self, exc: BaseException) -> int | None:
        """The checkpoint step holding the weights that diverged, if they were saved."""
        if self._saved is None:
            return None
        # A non-finite loss at update n came from the weights after update n - 1; weights that cannot be
        # saved (non-finite) are the current ones.
        known = exc.update if isinstance(exc, TrainingDivergedError) else None
        weights_after = known - 1 if known is not None else self.updates
        step, updates_before = self._saved
        return step if updates_before == weights_after else None

    def __enter__(self) -> DivergenceGuard:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, TrainingDivergedError | NonFiniteWeightsError):
            message = f"{exc}; {self._keep_last_good(self._diverged_step(exc))}; {self.advice}"
            raise TrainingDivergedError(message) from None

    def _keep_last_good(self, diverged_step: int | None) -> str:
        """Point `last` at the newest checkpoint not holding the weights that diverged; say which it is."""
        bad = checkpoint_dir(self.run_dir, diverged_step) if diverged_step is not None else None
        good = [p for p in list_checkpoints(self.run_dir) if p != bad]
        if bad is not None and bad.exists():
            if not good:
                return f"checkpoint {bad} holds the weights that gave it and no earlier checkpoint exists"
            set_last(self.run_dir, good[-1])
            return (
                f"checkpoint {bad.name} holds the weights that gave it, so checkpoints/last now points at the "
                f"last good checkpoint, {good[-1]}"
            )
        if good:
            return f"the last good checkpoint is {good[-1]} (checkpoints/last)"
        return "no checkpoint was saved before"


class MetricsLogger:
    """Append metrics to `run_dir/metrics.jsonl`, redraw `run_dir/curves.png`, forward to wandb if enabled.

    An existing file is read back: a line that is not valid JSON (the half-written last line of a process
    killed while appending) is dropped with a warning, and with `resume_step` set, records logged after that
    step (by the interrupted run, past its last checkpoint) are dropped, so the file holds one trajectory.
    A full disk (or file size limit) while appending leaves the file as it was and raises an OSError naming
    it.
    """

    def __init__(
        self, run_dir: Path, cfg: DictConfig, resume_step: int | None = None, plot_every_s: float = 30.0
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.plot_every_s = plot_every_s
        self._last_plot = 0.0
        self.records: list[dict[str, Any]] = []
        if self.path.exists():
            self.records = read_records(self.path)
            if resume_step is not None:
                after = [r for r in self.records if r["step"] > resume_step]
                if after:
                    log.info(
                        "%s: dropped %d records logged after step %d (the interrupted run's, not checkpointed)",
                        self.path,
                        len(after),
                        resume_step,
                    )
                self.records = [r for r in self.records if r["step"] <= resume_step]
            self._rewrite()
        self.wandb = None
        if cfg.wandb.enable:
            import wandb

            self.wandb = wandb.init(
                project=cfg.wandb.project,
                entity=cfg.wandb.entity,
                mode=cfg.wandb.mode,
                dir=str(self.run_dir),
                config=OmegaConf.to_container(cfg, resolve=True),
                name=cfg.job_name or self.run_dir.name,
                resume="allow",
                id=self.run_dir.name.replace("/", "_"),
            )

    def _rewrite(self) -> None:
        # Atomic: a kill during the rewrite leaves the old file whole.
        write_text(self.path, "".join(json.dumps(record) + "\n" for record in self.records))

    def log(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        """Record `metrics` at `step` under `split` ("train" or "eval")."""
        record = {"step": int(step), "split": split, "time": time.time()}
        record.update({k: float(v) for k, v in metrics.items()})
        append_line(self.path, json.dumps(record) + "\n")
        self.records.append(record)
        if self.wandb is not None:
            self.wandb.log({f"{split}/{k}": v for k, v in metrics.items()}, step=int(step))
        if split == "eval" or time.monotonic() - self._last_plot > self.plot_every_s:
            self.plot()

    def log_video(self, step: int, path: str | Path, split: str = "eval") -> None:
        """Attach an mp4 to the wandb run (the file itself already lies in the run directory)."""
        if self.wandb is not None:
            import wandb

            self.wandb.log({f"{split}/video": wandb.Video(str(path), format="mp4")}, step=int(step))

    def plot(self) -> None:
        """Redraw the training curves PNG (atomically, so a reader never sees half a file)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self._last_plot = time.monotonic()
        fig, axes = plt.subplots(1, len(PLOTTED), figsize=(5 * len(PLOTTED), 3.5))
        for ax, (split, key, title) in zip(axes, PLOTTED):
            points = [(r["step"], r[key]) for r in self.records if r["split"] == split and key in r]
            points = [(s, v) for s, v in points if math.isfinite(v)]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if split == "eval" else None, markersize=3)
                if key == "loss" and min(values) > 0:
                    ax.set_yscale("log")
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        try:
            atomic_write(self.run_dir / CURVES_FILE, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
        finally:
            plt.close(fig)

    def close(self) -> None:
        """Final plot and wandb shutdown."""
        self.plot()
        if self.wandb is not None:
            self.wandb.finish()


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; lines that are not whole JSON records are dropped with a warning."""
    records, bad = [], []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and "step" in record and "split" in record:
                records.append(record)
            else:
                bad.append(number)
    if bad:
        log.warning(
            "%s: dropped %d unreadable line(s) (%s), e.g. half-written by a killed run",
            path,
            len(bad),
            ", ".join(f"line {n}" for n in bad[:3]),
        )
    return records
