"""Plot the env-ceiling and evaluation scaling curves from benchmarks/results/{envs,eval}.json.

python benchmarks/plot_results.py   # writes benchmarks/results/scaling.png
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from common import RESULTS_DIR  # noqa: E402


def main() -> None:
    envs = json.loads((RESULTS_DIR / "envs.json").read_text())["rows"]
    evals_path = RESULTS_DIR / "eval.json"
    evals = json.loads(evals_path.read_text())["rows"] if evals_path.exists() else []
    names = sorted({r["env"] for r in envs})
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for mode, style in (("sync", "-"), ("async", "--")):
            rows = sorted(
                (r for r in envs if r["env"] == name and r["mode"] == mode), key=lambda r: r["n_envs"]
            )
            ax.plot(
                [r["n_envs"] for r in rows],
                [r["steps_per_s"] for r in rows],
                style,
                marker="o",
                label=f"ceiling {mode}",
            )
            rows = sorted(
                (r for r in evals if r["env"] == name and r["mode"] == mode and r["policy"] == "random"),
                key=lambda r: r["n_envs"],
            )
            if rows:
                ax.plot(
                    [r["n_envs"] for r in rows],
                    [r["steps_per_s"] for r in rows],
                    style,
                    marker="x",
                    label=f"eval_policy random {mode}",
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n_envs")
        ax.set_ylabel("env steps / s")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = RESULTS_DIR / "scaling.png"
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
