"""Size and opening time of the pages of `lerobot.reports` (docs/viewer_and_reports.md):

- a 500-episode evaluation's `report.html` (one task; and MetaWorld MT10's 10 x 50 episodes): its size in
  bytes (target: under 5 MB, videos apart) and its opening time in headless Chromium;
- the dataset viewer of the PushT demonstrations (206 episodes, 25,650 frames; the zarr from
  $LEROBOT_DATA_ROOT or ../shared/data/pusht): the time to write it, its size, and its opening time in
  headless Chromium (target: under 2 s), from the navigation's start to the page's `viewer-ready` mark
  (episode list and first episode drawn) and to its load event, over `--repeats` fresh tabs.

    python benchmarks/bench_pages.py [--repeats 5] [--viewer-dir DIR]   # writes benchmarks/results/pages.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import save_results

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the DevTools-pipe driver the browser tests use

from browser import Browser, find_chromium  # noqa: E402

from lerobot.config import DatasetConfig  # noqa: E402
from lerobot.datasets import import_dataset  # noqa: E402
from lerobot.episode_stats import aggregate_episodes  # noqa: E402
from lerobot.reports.dataset_viewer import write_dataset_viewer  # noqa: E402
from lerobot.reports.eval_report import write_eval_report  # noqa: E402

MT10 = [
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3",
    "drawer-close-v3", "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
]  # fmt: skip
TIMING = """JSON.stringify({ready: (performance.getEntriesByName("viewer-ready")[0] || {}).startTime ?? null,
  dcl: performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd,
  load: performance.getEntriesByType("navigation")[0].loadEventEnd})"""


def fake_eval(out: Path, n: int, tasks: list[str] | None) -> dict:
    """An evaluation of `n` episodes (per task) as `lerobot.evaluation` writes it, with random figures."""
    rng = np.random.default_rng(0)
    rows = []
    for k, task in enumerate(tasks or [None]):
        for i in range(n):
            reward = float(rng.uniform(0, 1))
            row = {
                "episode_ix": k * n + i,
                "seed": 100000 + i,
                "sum_reward": 40 * reward,
                "max_reward": reward,
            }
            row.update(success=reward > 0.6, n_steps=int(rng.integers(30, 300)))
            rows.append(row if task is None else {**row, "task": task})
    info = {"per_episode": rows, "aggregated": aggregate_episodes(rows, 300.0, 90_000, 100_000)}
    info["config"] = {
        "env": {"name": "metaworld" if tasks else "pusht", "task": tasks},
        "policy": {"name": "diffusion"},
    }
    info["checkpoint"] = {"path": "outputs/train/run/checkpoints/000016000", "step": 16000, "weights": "ema"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_info.json").write_text(json.dumps(info))
    return info


def open_times(browser: Browser, page: Path, repeats: int) -> list[dict]:
    """Performance timings (ms from the navigation's start) of `repeats` fresh tabs showing `page`."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tab = browser.open(page)
        wall = time.perf_counter() - t0
        timing = json.loads(tab.evaluate(TIMING))
        assert not tab.errors, tab.errors
        times.append({**timing, "open_wall_ms": 1000 * wall})
    return times


def summary(times: list[dict], key: str) -> dict:
    values = [t[key] for t in times if t[key] is not None]
    return {
        "first_ms": round(values[0], 1),
        "median_ms": round(statistics.median(values), 1),
        "max_ms": round(max(values), 1),
    }


def pusht_zarr() -> Path:
    for root in (os.environ.get("LEROBOT_DATA_ROOT"), REPO.parent / "shared" / "data" / "pusht"):
        if root and (Path(root) / "pusht_cchi_v7_replay.zarr").is_dir():
            return Path(root) / "pusht_cchi_v7_replay.zarr"
    raise SystemExit("PushT zarr not found: set LEROBOT_DATA_ROOT to the directory holding it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--viewer-dir", type=Path, help="where the PushT viewer goes (default: a temporary dir)"
    )
    args = parser.parse_args()
    if find_chromium() is None:
        raise SystemExit("headless Chromium not found: apt-get install -y chromium")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Browser(timeout_s=60) as browser:
        for name, tasks, n in (("eval_500_episodes", None, 500), ("eval_mt10_10x50_episodes", MT10, 50)):
            out = Path(tmp) / name
            fake_eval(out, n, tasks)
            t0 = time.perf_counter()
            page = write_eval_report(out)
            write_s = time.perf_counter() - t0
            times = open_times(browser, page, args.repeats)
            rows.append(
                {
                    "page": name,
                    "bytes": page.stat().st_size,
                    "write_s": round(write_s, 3),
                    "load": summary(times, "load"),
                }
            )
            print(rows[-1])
        root = import_dataset(DatasetConfig(root=str(pusht_zarr())))  # converted once, then reused
        viewer_dir = args.viewer_dir or Path(tmp) / "viewer"
        t0 = time.perf_counter()
        index = write_dataset_viewer(root, viewer_dir)
        write_s = time.perf_counter() - t0
        videos = sum(p.stat().st_size for p in viewer_dir.rglob("*.mp4"))
        times = open_times(browser, index, args.repeats)
        meta = json.loads((root / "meta.json").read_text())
        rows.append(
            {
                "page": "viewer_pusht",
                "episodes": meta["num_episodes"],
                "frames": meta["num_frames"],
                "index_bytes": index.stat().st_size,
                "video_bytes": videos,
                "write_s": round(write_s, 1),
                "ready": summary(times, "ready"),
                "load": summary(times, "load"),
                "runs": times,
            }
        )
        print({k: v for k, v in rows[-1].items() if k != "runs"})
    version = subprocess.run([find_chromium(), "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"wrote {save_results('pages', rows, {'chromium': version, 'command': 'python benchmarks/bench_pages.py'})}"
    )


if __name__ == "__main__":
    main()
