"""`scripts/edit_dataset.py`: edit LeRobotDatasets v3.0 into new ones (`lerobot.datasets.edit`).

    edit_dataset.py delete SRC --out DIR (--episodes 3,7,10-12 | --where success=false ...)
    edit_dataset.py split SRC --out DIR (--val-fraction 0.1 [--seed 0] | --val-episodes 3,7)
    edit_dataset.py merge SRC SRC [SRC ...] --out DIR
    edit_dataset.py remove-feature SRC NAME [NAME ...] --out DIR
    edit_dataset.py keep-tasks SRC TASK [TASK ...] --out DIR

Errors a user can fix (an unknown episode, feature or task, a field the dataset lacks, features that differ
in a merge, an `--out` that exists) end as one line `error: ...` and exit status 2 (`lerobot.cli.exit`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lerobot.cli.exit import run_command
from lerobot.datasets.edit import (
    check_new_out,
    delete_episodes,
    keep_tasks,
    merge_datasets,
    remove_features,
    split_dataset,
)
from lerobot.datasets.lerobot_format import INFO_PATH

EXAMPLES = """examples:
  edit_dataset.py delete outputs/data/demos --where success=false --out outputs/data/successes
  edit_dataset.py delete outputs/data/demos --episodes 3,7,10-12 --out outputs/data/clean
  edit_dataset.py split outputs/data/demos --val-fraction 0.1 --seed 0 --out outputs/data/split
  edit_dataset.py merge outputs/data/a outputs/data/b --out outputs/data/ab
  edit_dataset.py remove-feature outputs/data/demos next.reward --out outputs/data/no_reward
  edit_dataset.py keep-tasks outputs/data/demos reach-v3 push-v3 --out outputs/data/two_tasks"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edit_dataset.py",
        description="Write an edited copy of LeRobotDatasets v3.0 (the sources are never changed).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    operations = parser.add_subparsers(dest="operation", required=True, metavar="OPERATION")
    out_help = "the dataset directory to create (must not exist)"

    delete = operations.add_parser("delete", help="delete episodes by index or by a condition")
    delete.add_argument("source", help="the LeRobotDataset directory (holds meta/info.json)")
    delete.add_argument("--episodes", default="", help="indices and ranges, e.g. 3,7,10-12")
    delete.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD OP VALUE",
        help="delete the episodes this holds for (all of them when repeated): success=false, task=TEXT, "
        "length<20, or a column of meta/episodes; OP: = != < <= > >=",
    )
    delete.add_argument("--out", required=True, help=out_help)

    split = operations.add_parser("split", help="split into OUT/train and OUT/val")
    split.add_argument("source", help="the LeRobotDataset directory")
    which = split.add_mutually_exclusive_group(required=True)
    which.add_argument("--val-fraction", type=float, help="fraction of episodes for validation, e.g. 0.1")
    which.add_argument("--val-episodes", help="the validation episodes, e.g. 3,7,10-12")
    split.add_argument("--seed", type=int, default=0, help="draws the validation episodes (default 0)")
    split.add_argument("--out", required=True, help="the directory to create, holding train/ and val/")

    merge = operations.add_parser("merge", help="merge datasets of the same features and fps")
    merge.add_argument("sources", nargs="+", help="two or more LeRobotDataset directories, in order")
    merge.add_argument("--out", required=True, help=out_help)

    remove = operations.add_parser("remove-feature", help="remove features (columns, videos, statistics)")
    remove.add_argument("source", help="the LeRobotDataset directory")
    remove.add_argument("names", nargs="+", metavar="NAME", help="a feature of meta/info.json")
    remove.add_argument("--out", required=True, help=out_help)

    keep = operations.add_parser("keep-tasks", help="keep the episodes of some tasks")
    keep.add_argument("source", help="the LeRobotDataset directory")
    keep.add_argument("tasks", nargs="+", metavar="TASK", help="a task string of meta/tasks.parquet")
    keep.add_argument("--out", required=True, help=out_help)
    return parser


def _edit(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    check_new_out(args.out)  # before reading any source
    t0 = time.perf_counter()
    if args.operation == "delete":
        outs = [delete_episodes(args.source, args.out, episodes=args.episodes, where=args.where)]
    elif args.operation == "split":
        split = split_dataset(
            args.source,
            args.out,
            val_fraction=args.val_fraction,
            seed=args.seed,
            val_episodes=args.val_episodes,
        )
        outs = list(split.values())
    elif args.operation == "merge":
        outs = [merge_datasets(args.sources, args.out)]
    elif args.operation == "remove-feature":
        outs = [remove_features(args.source, args.out, args.names)]
    else:
        outs = [keep_tasks(args.source, args.out, args.tasks)]
    seconds = time.perf_counter() - t0
    for out in outs:
        print(f"wrote {out}: {_summary(out)} in {seconds:.1f} s")
    return 0


def _summary(out: Path) -> str:
    """`N episodes, M frames, T tasks` of the dataset written at `out`."""
    info = json.loads((Path(out) / INFO_PATH).read_text())
    return f"{info['total_episodes']} episodes, {info['total_frames']} frames, {info['total_tasks']} tasks"


def edit_main(argv: list[str] | None = None) -> int:
    """`scripts/edit_dataset.py`: errors a user can fix end as one line and exit code 2."""
    return run_command(_edit, argv)
