"""The metrics of a training run: `metrics.jsonl` (one JSON record per line), the curves PNG drawn from it,
and wandb when enabled.

`read_records` reads a metrics file back (scripts and sweeps read runs with it).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot.reports.run_index import try_write_run_index
from lerobot.runtime.files import append_line, atomic_write, write_text

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
# Curves drawn in the PNG: (split, key, panel title).
PLOTTED = (
    ("train", "loss", "train loss"),
    ("eval", "pc_success", "eval success (%)"),
    ("eval", "avg_max_reward", "eval avg max reward"),
)


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
        try_write_run_index(self.run_dir)  # index.html beside the curves; a failure is a warning

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
