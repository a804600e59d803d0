"""Evaluation curves of training runs side by side: average max reward and success (with their 95%
intervals where recorded) against hours of training or training steps.

    python scripts/plot_runs.py RUN_DIR[:LABEL] ... --out curves.png [--x hours|steps]

Hours of training are the run's wall time between its metric records, without the time spent evaluating
(`eval_s`) and without gaps longer than `--gap-min` minutes (a run stopped and resumed later).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lerobot.errors import exit_with_error
from lerobot.reports.runs_page import write_runs_page
from lerobot.training.metrics import METRICS_FILE, read_records


def training_hours(records: list[dict], gap_s: float) -> list[float]:
    """Per record of a run's metrics, the hours of training before it was written: wall time between
    records, less evaluation time, with gaps over `gap_s` seconds (a stop before a resume) left out."""
    total, previous, hours = 0.0, None, []
    for record in records:
        if previous is not None:
            elapsed = record["time"] - previous - record.get("eval_s", 0.0)
            if elapsed <= gap_s:
                total += max(elapsed, 0.0)
        previous = record["time"]
        hours.append(total / 3600)
    return hours


def main(argv: list[str] | None = None) -> None:
    """Plot the runs as `argv` says; bad input ends with one `error:` line and exit status 2."""
    # The docstring's first paragraph says what it does, its last one what "hours" counts.
    paragraphs = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(description=paragraphs[0], epilog=paragraphs[-1])
    parser.add_argument("runs", nargs="+", help="run directories, each optionally followed by :LABEL")
    parser.add_argument("--out", type=Path, help="PNG file to write")
    parser.add_argument("--html", type=Path, help="HTML page of the runs (with --out or instead of it)")
    parser.add_argument(
        "--x", choices=("hours", "steps"), default="hours", help="x axis (default: %(default)s)"
    )
    parser.add_argument(
        "--gap-min", type=float, default=30.0, help="minutes: a longer gap counts as a stop (default: 30)"
    )
    args = parser.parse_args(argv)
    if args.out is None and args.html is None:
        parser.error("pass --out PNG, --html PAGE or both")
    if args.html is not None:
        runs = [(spec.partition(":")[0], spec.partition(":")[2]) for spec in args.runs]
        try:
            print(f"wrote {write_runs_page(args.html, runs, gap_s=60 * args.gap_min)}")
        except OSError as e:  # a run directory without metrics, a page that cannot be written
            exit_with_error(str(e))
        if args.out is None:
            return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.runs:
        run_dir, _, label = spec.partition(":")
        path = Path(run_dir) / METRICS_FILE
        if not path.is_file():
            exit_with_error(f"{path} not found: pass a run directory (output_dir of a training run)")
        records = read_records(path)
        hours = training_hours(records, gap_s=60 * args.gap_min)
        evals = [(h, r) for h, r in zip(hours, records, strict=True) if r["split"] == "eval"]
        if not evals:
            last = f", up to step {records[-1]['step']}" if records else ""
            exit_with_error(
                f"{path} holds no evaluation yet ({len(records)} training records{last}): the run's first comes "
                "at step eval.freq (never with eval.freq=0); plot the run once it has one"
            )
        xs = [h if args.x == "hours" else r["step"] for h, r in evals]
        for ax, key in zip(axes, ("avg_max_reward", "pc_success"), strict=True):
            ys = [r[key] for _, r in evals]
            (line,) = ax.plot(xs, ys, marker="o", label=label or Path(run_dir).name)
            if all(f"{key}_ci95_low" in r for _, r in evals):
                low = [r[f"{key}_ci95_low"] for _, r in evals]
                high = [r[f"{key}_ci95_high"] for _, r in evals]
                ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    for ax, title in zip(axes, ("eval avg max reward", "eval success (%)"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("hours of training" if args.x == "hours" else "training steps")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
    except (OSError, ValueError) as e:  # ValueError: an extension matplotlib cannot write
        exit_with_error(f"cannot write {args.out}: {e}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
