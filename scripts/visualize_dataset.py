"""Write a dataset viewer (index.html and per-episode mp4s) that opens from disk in any browser:

    python scripts/visualize_dataset.py --root DIR [--out DIR] [--episodes 0,5,10-19] [--rerun FILE.rrd]
    python scripts/visualize_dataset.py dataset.repo_id=lerobot/pusht [dataset.KEY=VALUE ...]

`--root` is a LeRobotDataset (v3.0 or v2.1: it holds meta/info.json), Diffusion Policy's PushT zarr (or the
directory holding it), or a dataset this project converted already (it holds meta.json). Without `--root`,
`dataset.*` settings choose the data as they do for scripts/train.py (default: the PushT demonstrations).
Every source is imported as training imports it (converted once, then reused). `--rerun FILE.rrd` also writes
the chosen episodes (default: the first) as a rerun recording; it needs `pip install -e ".[viz]"`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from lerobot.cli.exit import run_command
from lerobot.cli.export import dataset_config_from_overrides
from lerobot.config import DatasetConfig
from lerobot.datasets import import_dataset
from lerobot.datasets.format import META_FILE, read_meta
from lerobot.datasets.lerobot_format import INFO_PATH
from lerobot.errors import ConfigError
from lerobot.reports.dataset_viewer import write_dataset_viewer
from lerobot.reports.rerun_export import import_rerun, write_rerun

log = logging.getLogger("visualize_dataset")


def parse_episodes(text: str | None) -> list[int] | None:
    """`0,3,10-12` -> [0, 3, 10, 11, 12]; None for None. A malformed list is a ConfigError."""
    if text is None:
        return None
    episodes: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, _, last = part.partition("-")
            episodes += range(int(first), int(last or first) + 1)
    except ValueError:
        raise ConfigError(f"--episodes {text}: expected episode numbers and ranges, e.g. 0,5,10-19") from None
    if not episodes:
        raise ConfigError(f"--episodes {text}: names no episode")
    return sorted(set(episodes))


def converted_root(root: str | None, overrides: list[str]) -> Path:
    """The converted dataset to show: `root` itself when it is one, else what the importer that fits `root`
    (a LeRobotDataset, the PushT zarr) or the `dataset.*` overrides give."""
    if root is not None and (Path(root) / META_FILE).is_file():
        return Path(root)
    cfg = dataset_config_from_overrides(overrides) if overrides else DatasetConfig()
    if root is not None:
        lerobot = (Path(root) / INFO_PATH).is_file()
        cfg.root, cfg.format = str(root), cfg.format or ("lerobot" if lerobot else "pusht_zarr")
    return import_dataset(cfg)


def _visualize(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root", help="a LeRobotDataset, the PushT zarr (or its directory), or a converted dataset"
    )
    parser.add_argument(
        "--out", type=Path, help="the viewer's folder (default: outputs/viewer/<dataset name>)"
    )
    parser.add_argument("--episodes", help="episodes to show, e.g. 0,5,10-19 (default: all)")
    parser.add_argument(
        "--max-points", type=int, default=1000, help="most points per plotted series and episode"
    )
    parser.add_argument("--no-videos", action="store_true", help="plots only: encode no video")
    parser.add_argument(
        "--rerun", type=Path, help="also write the chosen episodes (default: the first) as an .rrd"
    )
    parser.add_argument(
        "overrides", nargs="*", help="dataset.KEY=VALUE settings choosing the data (as for train.py)"
    )
    args = parser.parse_intermixed_args(argv)
    episodes = parse_episodes(args.episodes)
    if args.rerun is not None:
        import_rerun()  # before any work: a missing rerun-sdk is one line
    root = converted_root(args.root, args.overrides)
    meta = read_meta(root)
    total = len(meta["episode_ends"])
    if episodes is not None and episodes[-1] >= total:
        raise ConfigError(f"--episodes {args.episodes}: the dataset at {root} has episodes 0-{total - 1}")
    out = args.out or Path("outputs/viewer") / Path(str(meta.get("name") or root.parent.name)).name
    t0 = time.perf_counter()
    index = write_dataset_viewer(
        root, out, episodes=episodes, max_points=args.max_points, videos=not args.no_videos
    )
    shown = total if episodes is None else len(episodes)
    print(f"wrote {index} ({shown} episodes, {time.perf_counter() - t0:.1f} s): open it in a browser")
    if args.rerun is not None:
        rrd = write_rerun(root, args.rerun, episodes or [0])
        print(f"wrote {rrd}: view it with `rerun {rrd}`")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`scripts/visualize_dataset.py`: errors a user can fix end as one line and exit status 2."""
    return run_command(_visualize, argv)


if __name__ == "__main__":
    sys.exit(main())
