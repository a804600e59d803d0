"""`scripts/export_dataset.py`: write a dataset (default: the PushT demonstrations) as a LeRobotDataset v3.0."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lerobot.cli.exit import run_command
from lerobot.config import DatasetConfig
from lerobot.datasets import import_dataset
from lerobot.datasets.lerobot_export import VideoEncoding, export_lerobot_dataset
from lerobot.errors import ConfigError, DatasetError


def dataset_config_from_overrides(overrides: list[str]) -> DatasetConfig:
    """`dataset.key=value` overrides -> a checked `DatasetConfig` (an unknown key or bad value is a ConfigError)."""

    bad = [o for o in overrides if not o.startswith("dataset.") or "=" not in o]
    if bad:
        raise ConfigError(f"{bad}: expected dataset.KEY=VALUE settings (e.g. dataset.root=DIR)")
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(DatasetConfig),
            OmegaConf.from_dotlist([o[len("dataset.") :] for o in overrides]),
        )
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"dataset settings {overrides}: {str(e).splitlines()[0]}") from None


def _export(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a dataset (default: the PushT demonstrations) as a LeRobotDataset v3.0.",
        epilog="example: --out outputs/pusht_lerobot dataset.root=../shared/data/pusht",
    )
    parser.add_argument("--out", required=True, help="the LeRobotDataset directory to create")
    parser.add_argument(
        "--task", default=None, help="task string of every episode (default: the dataset's name)"
    )
    parser.add_argument("--episodes-per-file", type=int, default=None, help="default: all in one file")
    parser.add_argument(
        "--crf", type=int, default=VideoEncoding.crf, help="AV1 quality (lower: larger, closer)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    parser.add_argument(
        "overrides", nargs="*", help="dataset.* settings choosing the source (as for train.py)"
    )
    args = parser.parse_intermixed_args(argv)
    if Path(args.out).exists() and not args.overwrite:
        raise DatasetError(f"{args.out}: already exists; choose another directory or pass --overwrite")
    source = import_dataset(dataset_config_from_overrides(args.overrides))
    t0 = time.perf_counter()
    out = export_lerobot_dataset(
        source,
        args.out,
        task=args.task,
        episodes_per_file=args.episodes_per_file,
        encoding=VideoEncoding(crf=args.crf),
        overwrite=args.overwrite,
    )
    print(f"wrote LeRobotDataset v3.0 {out} from {source} in {time.perf_counter() - t0:.1f} s")
    return 0


def export_main(argv: list[str] | None = None) -> int:
    """`scripts/export_dataset.py`: errors a user can fix end as one line and exit code 2."""
    return run_command(_export, argv)
