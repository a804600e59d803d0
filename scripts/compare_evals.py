"""Paired difference between evaluations on the same initial states (same `eval.start_seed`):

    python scripts/compare_evals.py BASE_EVAL OTHER_EVAL [BASE_EVAL2 OTHER_EVAL2 ...]

Each argument is an `eval_info.json` or its directory; arguments go in (base, other) pairs, matched
episode by episode on reset seeds, and all pairs are pooled (one pair per training seed, say). Prints
`other - base` for average max reward and success, with 95% intervals of the paired differences.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lerobot.compare import paired_difference
from lerobot.errors import exit_with_error
from lerobot.reports.runs_page import write_evals_page


def main(argv: list[str] | None = None) -> None:
    """Print the paired differences `argv` asks for; bad input ends with one `error:` line and exit status 2."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evals", nargs="+", help="BASE OTHER [BASE OTHER ...]: eval_info.json files or dirs")
    parser.add_argument("--html", type=Path, help="also write a page of the evaluations and their difference")
    args = parser.parse_args(argv)
    if len(args.evals) % 2:
        parser.error(f"{len(args.evals)} evaluations given: pass them in (base, other) pairs")
    pairs = list(zip(args.evals[::2], args.evals[1::2], strict=True))
    try:
        r = paired_difference(pairs)
    except (FileNotFoundError, ValueError) as exc:
        exit_with_error(str(exc))
    print(f"{r['n_pairs']} paired episodes over {len(pairs)} pair(s) of evaluations")
    print(
        f"avg_max_reward: base {r['base_avg_max_reward']:.3f}, other {r['other_avg_max_reward']:.3f}, "
        f"other - base {r['delta_avg_max_reward']:+.3f} "
        f"[{r['delta_avg_max_reward_ci_low']:+.3f}, {r['delta_avg_max_reward_ci_high']:+.3f}]"
    )
    print(
        f"pc_success:     base {r['base_pc_success']:.1f}, other {r['other_pc_success']:.1f}, "
        f"other - base {r['delta_pc_success']:+.1f} "
        f"[{r['delta_pc_success_ci_low']:+.1f}, {r['delta_pc_success_ci_high']:+.1f}] points"
    )
    if args.html is not None:
        print(f"wrote {write_evals_page(args.html, args.evals, r)}")


if __name__ == "__main__":
    main()
