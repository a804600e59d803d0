"""Pages over several runs or evaluations: `scripts/plot_runs.py --html OUT` and
`scripts/compare_evals.py --html OUT`.

`write_runs_page(out, runs)`: the runs' evaluation success and average max reward against hours of training
and against steps (95% bands), their training losses, and a table of the runs (last and best evaluation),
each linked to its own `index.html`. `write_evals_page(out, evals, paired)`: the evaluations side by side
(success and max reward with intervals, bars), each linked to its `report.html`, and the paired difference
`lerobot.compare.paired_difference` computed for them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lerobot.constants import EVAL_INFO_FILE
from lerobot.reports import html
from lerobot.reports.eval_report import REPORT_FILE
from lerobot.reports.run_index import (
    GAP_S,
    INDEX_FILE,
    METRICS_FILE,
    RunData,
    decimate,
    load_run,
    metric_series,
)

PAGE_JS = """
const PAGE = LR.data("page-data");
for (const c of PAGE.charts) LR.chart(document.getElementById(c.id), c.opts);
"""


def _runs_charts(runs: list[tuple[RunData, str]]) -> list[dict[str, Any]]:
    """One chart per figure, one series per run."""
    specs = [
        ("success-hours", "eval success (%) against hours of training", "eval", "pc_success", True),
        ("success-steps", "eval success (%) against steps", "eval", "pc_success", False),
        ("reward-hours", "eval average max reward against hours of training", "eval", "avg_max_reward", True),
        ("reward-steps", "eval average max reward against steps", "eval", "avg_max_reward", False),
        ("loss", "training loss", "train", "loss", False),
    ]
    charts = []
    for name, title, split, key, by_hours in specs:
        series = []
        for run, label in runs:
            xy = metric_series(run.split(split), key, by_hours=by_hours)
            if xy["x"]:
                series.append({"name": label, "points": split == "eval", **decimate(xy)})
        if series:
            opts: dict[str, Any] = {"series": series, "xlabel": "hours" if by_hours else "step"}
            if key == "loss":
                opts["logy"] = all(v is not None and v > 0 for s in series for v in s["y"])
            charts.append({"id": f"chart-{name}", "title": title, "opts": opts})
    return charts


def _run_row(run: RunData, label: str, out_dir: Path) -> list[str]:
    evals = [r for _, r in run.split("eval")]
    train = [r for _, r in run.split("train")]
    last = evals[-1] if evals else {}
    best = max(evals, key=lambda r: r.get("pc_success", -1.0)) if evals else {}
    page_file = run.path / INDEX_FILE if (run.path / INDEX_FILE).is_file() else run.path / METRICS_FILE
    return [
        html.esc(label),
        f'<a href="{html.rel(page_file, out_dir)}">{html.esc(run.path.name)}</a>',
        html.fmt(train[-1]["step"] if train else None),
        html.fmt(run.hours[-1] if run.hours else None, 2),
        html.fmt(last.get("pc_success"), 1),
        html.interval(last.get("pc_success_ci95_low"), last.get("pc_success_ci95_high"), 1),
        f"{html.fmt(best.get('pc_success'), 1)} (step {html.fmt(best.get('step'))})" if best else "-",
        html.fmt(last.get("avg_max_reward")),
        html.interval(last.get("avg_max_reward_ci95_low"), last.get("avg_max_reward_ci95_high")),
    ]


def write_runs_page(out: Path | str, runs: Sequence[tuple[Path | str, str]], gap_s: float = GAP_S) -> Path:
    """Write the page of several training runs (`(run_dir, label)` pairs; an empty label: the run's name)."""
    out = Path(out)
    for path, _ in runs:
        if not (Path(path) / METRICS_FILE).is_file():
            raise FileNotFoundError(
                f"{Path(path) / METRICS_FILE} not found: pass a run directory (output_dir of a training run)"
            )
    loaded = [(load_run(path, gap_s), label or Path(path).name) for path, label in runs]
    charts = _runs_charts(loaded)
    headers = [
        "run",
        "directory",
        "steps",
        "hours",
        "last success %",
        "95% CI",
        "best success %",
        "last avg max reward",
        "95% CI",
    ]
    rows = [_run_row(run, label, out.parent) for run, label in loaded]
    body = "".join(
        [
            f"<h1>{len(loaded)} training runs</h1>",
            '<div class="muted">hours of training: wall time between metric records, evaluations and long stops left out</div>',
            '<div class="charts">',
            "".join(html.chart_div(c["id"], c["title"]) for c in charts)
            or '<p class="muted">No metrics yet.</p>',
            "</div><h2>Runs</h2>",
            html.table(
                headers,
                rows,
                numeric=[False, False, True, True, True, True, True, True, True],
                table_id="runs",
            ),
            html.json_script("page-data", {"charts": charts}),
        ]
    )
    return html.write_page(out, html.page("training runs", body, script=PAGE_JS + 'LR.sortable("runs");'))


def _eval_row(path: Path, out_dir: Path) -> list[str]:
    directory = path if path.is_dir() else path.parent
    info = json.loads((directory / EVAL_INFO_FILE).read_text())
    agg, cfg = info["aggregated"], info.get("config", {})
    target = directory / REPORT_FILE if (directory / REPORT_FILE).is_file() else directory / EVAL_INFO_FILE
    step = (info.get("checkpoint") or {}).get("step")
    return [
        f'<a href="{html.rel(target, out_dir)}">{html.esc(directory.name)}</a>',
        html.esc(f"{cfg.get('policy', {}).get('name', '?')} on {cfg.get('env', {}).get('name', '?')}"),
        html.fmt(step),
        html.fmt(agg.get("n_episodes")),
        html.percent_bar(agg["pc_success"], agg.get("pc_success_ci95_low"), agg.get("pc_success_ci95_high")),
        html.fmt(agg["pc_success"], 1),
        html.interval(agg.get("pc_success_ci95_low"), agg.get("pc_success_ci95_high"), 1),
        html.fmt(agg["avg_max_reward"]),
        html.interval(agg.get("avg_max_reward_ci95_low"), agg.get("avg_max_reward_ci95_high")),
    ]


def _paired(paired: dict[str, Any]) -> str:
    reward = html.interval(paired["delta_avg_max_reward_ci_low"], paired["delta_avg_max_reward_ci_high"])
    success = html.interval(paired["delta_pc_success_ci_low"], paired["delta_pc_success_ci_high"], 1)
    return (
        f'<h2>Paired difference (other - base) over {paired["n_pairs"]:,} paired episodes</h2><div class="cards">'
        + html.card(
            "avg max reward: other - base", f"{paired['delta_avg_max_reward']:+.3f}", f"95% CI {reward}"
        )
        + html.card("success: other - base", f"{paired['delta_pc_success']:+.1f} pts", f"95% CI {success}")
        + html.card(
            "base / other avg max reward",
            f"{html.fmt(paired['base_avg_max_reward'])} / {html.fmt(paired['other_avg_max_reward'])}",
        )
        + html.card(
            "base / other success",
            f"{html.fmt(paired['base_pc_success'], 1)}% / {html.fmt(paired['other_pc_success'], 1)}%",
        )
        + "</div>"
    )


def write_evals_page(
    out: Path | str, evals: Sequence[Path | str], paired: dict[str, Any] | None = None
) -> Path:
    """Write the page of several evaluations (`eval_info.json` files or their directories), with the paired
    difference of `lerobot.compare.paired_difference` when given (the arguments then go in (base, other) pairs)."""
    out = Path(out)
    headers = [
        "evaluation",
        "policy / env",
        "checkpoint step",
        "episodes",
        "success",
        "%",
        "95% CI",
        "avg max reward",
        "95% CI",
    ]
    rows = [_eval_row(Path(p), out.parent) for p in evals]
    if paired is not None and len(rows) % 2 == 0:
        for i, row in enumerate(rows):
            row[0] = f'<span class="muted">{"base" if i % 2 == 0 else "other"} {i // 2 + 1}</span> {row[0]}'
    body = "".join(
        [
            f"<h1>{len(rows)} evaluations</h1>",
            _paired(paired) if paired is not None else "",
            "<h2>Evaluations</h2>",
            html.table(headers, rows, numeric=[False, False, True, True, False, True, True, True, True]),
        ]
    )
    return html.write_page(out, html.page("evaluations", body))
