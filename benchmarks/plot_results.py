"""Plot the env-ceiling and evaluation scaling curves from benchmarks/results/{envs,eval}.json.

python benchmarks/plot_results.py   # writes benchmarks/results/eval.png

Top row: the raw ceiling (`bench_envs.py`). Bottom row: `eval_policy` with the random policy next to the
ceiling measured in the same pairs (`bench_eval.py`: the evaluation's own episodes replayed), so the two
curves of a panel share the machine's load of that moment.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from common import RESULTS_DIR  # noqa: E402


def _curve(ax, rows: list[dict], key: str, style: str, marker: str, label: str) -> None:
    rows = sorted(rows, key=lambda r: r["n_envs"])
    if rows:
        ax.plot([r["n_envs"] for r in rows], [r[key] for r in rows], style, marker=marker, label=label)


def main() -> None:
    envs = json.loads((RESULTS_DIR / "envs.json").read_text())["rows"]
    evals_path = RESULTS_DIR / "eval.json"
    evals = json.loads(evals_path.read_text())["rows"] if evals_path.exists() else []
    evals = [r for r in evals if r["policy"] == "random"]
    names = sorted({r["env"] for r in envs})
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 8), squeeze=False)
    for col, name in enumerate(names):
        top, bottom = axes[0][col], axes[1][col]
        for mode, style in (("sync", "-"), ("async", "--")):
            _curve(top, [r for r in envs if r["env"] == name and r["mode"] == mode], "steps_per_s", style, "o",
                   f"ceiling {mode}")  # fmt: skip
            rows = [r for r in evals if r["env"] == name and r["mode"] == mode]
            _curve(bottom, rows, "ceiling_steps_per_s", style, "o", f"ceiling (replayed) {mode}")
            _curve(bottom, rows, "steps_per_s", style, "x", f"eval_policy random {mode}")
        top.set_title(f"{name}: raw ceiling (bench_envs.py)")
        bottom.set_title(f"{name}: eval_policy vs its paired ceiling (bench_eval.py)")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("n_envs")
            ax.set_ylabel("env steps / s")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    out = RESULTS_DIR / "eval.png"
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
