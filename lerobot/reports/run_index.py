"""A training run's page: `index.html` in its run directory.

`write_run_index(run_dir)` reads what the run wrote (`metrics.jsonl`, `checkpoints/`, `eval/step_N/`) and
shows the loss and learning-rate curves, evaluation success and max reward against steps and against hours of
training (with their 95% intervals), per-task success for multi-task runs, links to every evaluation's page,
the checkpoints, the config and the command that resumes the run. The trainer's metrics logger calls
`try_write_run_index` whenever it redraws `curves.png` (after each evaluation and at the end), which logs a
warning instead of failing the run.

Hours of training count wall time between metric records, less the time spent evaluating (`eval_s`) and
less gaps longer than `gap_s` (a run stopped and resumed later), as `scripts/plot_runs.py` counts them.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lerobot.reports.eval_report import REPORT_FILE
from lerobot.reports.html import chart_div, esc, fmt, interval, json_script, page, rel, table, write_page

log = logging.getLogger(__name__)

INDEX_FILE = "index.html"
METRICS_FILE = "metrics.jsonl"  # lerobot.training.metrics.METRICS_FILE: training writes it, pages only read
CURVES_FILE = "curves.png"
GAP_S = 30 * 60.0

INDEX_JS = """
const RUN = LR.data("run-data");
for (const c of RUN.charts) LR.chart(document.getElementById(c.id), c.opts);
LR.sortable("evaluations");
"""


@dataclass
class RunData:
    """What a run directory holds, as the pages read it."""

    path: Path
    records: list[dict[str, Any]]
    hours: list[float]
    config: dict[str, Any]
    config_path: Path | None
    checkpoints: list[str]
    last: str | None
    eval_dirs: dict[int, Path] = field(default_factory=dict)

    def split(self, name: str) -> list[tuple[float, dict[str, Any]]]:
        """(hours, record) of the records of split `name` (`train` or `eval`), in file order."""
        return [(h, r) for h, r in zip(self.hours, self.records) if r.get("split") == name]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; lines that are not whole records (a killed writer's) are skipped."""
    records = []
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "step" in record and "split" in record:
                records.append(record)
    return records


def training_hours(records: list[dict[str, Any]], gap_s: float = GAP_S) -> list[float]:
    """Per record, the hours of training before it: wall time between records, less evaluation time, with
    gaps over `gap_s` seconds left out."""
    total, previous, hours = 0.0, None, []
    for record in records:
        if previous is not None and "time" in record:
            elapsed = record["time"] - previous - record.get("eval_s", 0.0)
            if elapsed <= gap_s:
                total += max(elapsed, 0.0)
        previous = record.get("time", previous)
        hours.append(total / 3600)
    return hours


def load_run(run_dir: Path | str, gap_s: float = GAP_S) -> RunData:
    """Read a run directory (any part may be missing: a run that has just started)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / METRICS_FILE)
    ckpt_root = run_dir / "checkpoints"
    checkpoints = (
        sorted(p.name for p in ckpt_root.iterdir() if p.name.isdigit()) if ckpt_root.is_dir() else []
    )
    link = ckpt_root / "last"
    last = (
        link.resolve().name
        if link.is_symlink() and link.exists()
        else (checkpoints[-1] if checkpoints else None)
    )
    config_path = ckpt_root / last / "config.yaml" if last else None
    config: dict[str, Any] = {}
    if config_path is not None and config_path.is_file():
        config = yaml.safe_load(config_path.read_text()) or {}
    else:
        config_path = None
    eval_root = run_dir / "eval"
    eval_dirs = {}
    if eval_root.is_dir():
        for p in eval_root.iterdir():
            if p.name.startswith("step_") and p.name[5:].isdigit() and p.is_dir():
                eval_dirs[int(p.name[5:])] = p
    return RunData(
        run_dir, records, training_hours(records, gap_s), config, config_path, checkpoints, last, eval_dirs
    )


def resume_command(run: RunData) -> str:
    """The command that resumes `run`: its env, policy and recipe, and `output_dir` set to the run."""
    cfg = run.config
    args = ["python", "scripts/train.py"]
    if cfg.get("env", {}).get("name"):
        args.append(f"env={cfg['env']['name']}")
    if cfg.get("policy", {}).get("name"):
        args.append(f"policy={cfg['policy']['name']}")
    if cfg.get("recipe_applied"):
        args.append(f"+experiment={cfg['recipe_applied']}")
    args.append(f"output_dir={run.path}")
    return shlex.join(args)


def metric_series(
    points: list[tuple[float, dict[str, Any]]], key: str, by_hours: bool = False
) -> dict[str, list]:
    """{"x", "y", "lo", "hi"} of `key` over `points` (x: step or hours); lo/hi from `<key>_ci95_*` if present."""
    kept = [(h, r) for h, r in points if key in r]
    out: dict[str, list] = {
        "x": [round(h, 5) if by_hours else r["step"] for h, r in kept],
        "y": [r[key] for _, r in kept],
    }
    if kept and all(f"{key}_ci95_low" in r for _, r in kept):
        out["lo"] = [r[f"{key}_ci95_low"] for _, r in kept]
        out["hi"] = [r[f"{key}_ci95_high"] for _, r in kept]
    return out


def decimate(series: dict[str, list], most: int = 2000) -> dict[str, list]:
    """Every k-th point of a long training curve (the last one kept), so the page stays small."""
    n = len(series["x"])
    if n <= most:
        return series
    keep = list(range(0, n, math.ceil(n / most)))
    keep = keep if keep[-1] == n - 1 else [*keep, n - 1]
    return {k: [v[i] for i in keep] for k, v in series.items()}


def run_charts(run: RunData, prefix: str = "chart") -> list[dict[str, Any]]:
    """The charts of one run: `{"id", "title", "opts"}` for `LR.chart` (empty series are left out)."""
    train, evals = run.split("train"), run.split("eval")
    charts = []

    def add(name: str, title: str, series: list[dict[str, Any]], **opts: Any) -> None:
        series = [s for s in series if s["x"]]
        if series:
            charts.append({"id": f"{prefix}-{name}", "title": title, "opts": {"series": series, **opts}})

    loss = decimate(metric_series(train, "loss"))
    positive = all(v is not None and v > 0 for v in loss["y"])
    add("loss", "training loss", [{"name": "loss", **loss}], xlabel="step", logy=positive and bool(loss["y"]))
    add("lr", "learning rate", [{"name": "lr", **decimate(metric_series(train, "lr"))}], xlabel="step")
    add(
        "return",
        "episode return (online)",
        [{"name": "return", **decimate(metric_series(train, "episode_return"))}],
        xlabel="step",
    )
    success = {"name": "success %", "points": True}
    add(
        "success-steps",
        "eval success (%) against steps",
        [{**success, **metric_series(evals, "pc_success")}],
        xlabel="step",
        ymin=0,
    )
    add(
        "success-hours",
        "eval success (%) against hours of training",
        [{**success, **metric_series(evals, "pc_success", by_hours=True)}],
        xlabel="hours",
        ymin=0,
    )
    reward = {"name": "avg max reward", "points": True}
    add(
        "reward-steps",
        "eval average max reward against steps",
        [{**reward, **metric_series(evals, "avg_max_reward")}],
        xlabel="step",
    )
    tasks = sorted({k.split("/", 1)[1] for _, r in evals for k in r if k.startswith("pc_success/")})
    add(
        "tasks",
        "eval success (%) per task",
        [{"name": t, "points": True, **metric_series(evals, f"pc_success/{t}")} for t in tasks],
        xlabel="step",
        ymin=0,
    )
    return charts


def _evaluations(run: RunData) -> str:
    by_step = {r["step"]: (h, r) for h, r in run.split("eval")}
    steps = sorted(set(by_step) | set(run.eval_dirs))
    if not steps:
        return '<h2>Evaluations</h2><p class="muted">None yet (every eval.freq steps; never with eval.freq=0).</p>'
    rows = []
    for step in steps:
        hours, r = by_step.get(step, (None, {}))
        directory = run.eval_dirs.get(step)
        link = ""
        if directory is not None:
            target = (
                directory / REPORT_FILE
                if (directory / REPORT_FILE).is_file()
                else directory / "eval_info.json"
            )
            link = f'<a href="{rel(target, run.path)}">{esc(target.name)}</a>'
        rows.append(
            [
                f"{step:,}",
                fmt(hours, 2),
                f"{fmt(r.get('pc_success'), 1)}",
                interval(r.get("pc_success_ci95_low"), r.get("pc_success_ci95_high"), 1),
                fmt(r.get("avg_max_reward")),
                interval(r.get("avg_max_reward_ci95_low"), r.get("avg_max_reward_ci95_high")),
                fmt(int(r["n_episodes"]) if "n_episodes" in r else None),
                link,
            ]
        )
    headers = ["step", "hours", "success %", "95% CI", "avg max reward", "95% CI", "episodes", "page"]
    return "<h2>Evaluations</h2>" + table(headers, rows, numeric=[True] * 7 + [False], table_id="evaluations")


def _status(run: RunData) -> str:
    train = run.split("train")
    total = run.config.get("training", {}).get("steps")
    step = train[-1][1]["step"] if train else 0
    hours = run.hours[-1] if run.hours else 0.0
    cfg = run.config
    what = f"{cfg.get('policy', {}).get('name', '?')} on {cfg.get('env', {}).get('name', '?')}"
    done = " (finished)" if total and step >= total else ""
    return f"{esc(what)} &middot; step {step:,} of {fmt(total)}{done} &middot; {hours:.2f} h of training"


def _files(run: RunData) -> str:
    parts = ["<h2>Checkpoints and files</h2><ul>"]
    for name in run.checkpoints:
        mark = " <b>(last)</b>" if name == run.last else ""
        parts.append(f'<li><a href="checkpoints/{esc(name)}/">checkpoints/{esc(name)}</a>{mark}</li>')
    for name in (METRICS_FILE, CURVES_FILE):
        if (run.path / name).exists():
            parts.append(f'<li><a href="{name}">{name}</a></li>')
    parts.append("</ul>")
    parts.append(
        "<h2>Resume it</h2><p>Relaunch the command that started the run with <code>output_dir</code> set to this "
        "directory (a stopped run prints it). For the run's env, policy and recipe that is:</p>"
        f'<pre>{esc(resume_command(run))}</pre><p class="muted">plus any other setting the run was launched '
        "with: a relaunch whose config differs from the checkpoint's is refused, naming the keys.</p>"
    )
    if run.config_path is not None:
        parts.append(
            f'<h2>Config</h2><p><a href="{rel(run.config_path, run.path)}">{esc(rel(run.config_path, run.path))}</a></p>'
            f"<details><summary>show it</summary><pre>{esc(run.config_path.read_text())}</pre></details>"
        )
    return "".join(parts)


def write_run_index(run_dir: Path | str) -> Path:
    """Write `run_dir/index.html` from what the run directory holds; return its path."""
    run = load_run(run_dir)
    charts = run_charts(run)
    body = "".join(
        [
            f"<h1>Training run {esc(run.path.name)}</h1>",
            f'<div class="muted">{_status(run)} &middot; {esc(run.path.resolve())}</div>',
            '<h2>Curves</h2><div class="charts">',
            "".join(chart_div(c["id"], c["title"]) for c in charts) or '<p class="muted">No metrics yet.</p>',
            "</div>",
            _evaluations(run),
            _files(run),
            json_script("run-data", {"charts": charts}),
        ]
    )
    return write_page(run.path / INDEX_FILE, page(f"run {run.path.name}", body, script=INDEX_JS))


def try_write_run_index(run_dir: Path | str) -> Path | None:
    """`write_run_index`, with any failure logged as a warning (a training run never fails for its page).

    Nothing is written before the run's first metrics record: a launch that fails before it has recorded
    anything leaves no page behind (the run directory's clean-up removes only the files it knows)."""
    try:
        metrics = Path(run_dir) / METRICS_FILE
        if not metrics.is_file() or metrics.stat().st_size == 0:
            return None
        return write_run_index(run_dir)
    except Exception as e:  # noqa: BLE001 (the page is a convenience; training goes on)
        log.warning("could not write %s: %s: %s", Path(run_dir) / INDEX_FILE, type(e).__name__, e)
        return None
