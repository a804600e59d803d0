"""Shared benchmark helpers: machine facts, medians, JSON results, env configs."""

from __future__ import annotations

import os

# Before torch loads (as lerobot/__init__.py does): spinning OpenMP threads collapse on busy cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from lerobot.config import (  # noqa: E402
    CONFIG_DIR,  # noqa: E402
    EnvConfig,
    env_config,
    validate_config,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict:
    """CPU model, core count, AMX support, library versions: recorded with every result."""
    cpu = platform.processor()
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "amx_bf16": "amx_bf16" in flags,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_avg_1m": os.getloadavg()[0],
    }


def load_env(name: str, **overrides) -> EnvConfig:
    """An env config from `configs/env/<name>.yaml` with field overrides (e.g. max_episode_steps)."""
    cfg = validate_config({"env": OmegaConf.load(CONFIG_DIR / "env" / f"{name}.yaml")})
    for key, value in overrides.items():
        cfg.env[key] = value
    return env_config(cfg)


def median_of(fn: Callable[[], float], repeats: int) -> tuple[float, list[float]]:
    """Run `fn` (returning one measurement) `repeats` times; return the median and all values."""
    values = [fn() for _ in range(repeats)]
    return statistics.median(values), values


def save_results(name: str, rows: list[dict], extra: dict | None = None) -> Path:
    """Write `benchmarks/results/<name>.json` with the machine facts (atomically)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"machine": machine_info(), "rows": rows, **(extra or {})}, indent=2))
    tmp.replace(path)
    return path


def keep_previous_rows(name: str, rows: list[dict], key: str | tuple[str, ...]) -> list[dict]:
    """`rows` plus the rows of `results/<name>.json` whose `key` value (or values, for a tuple of keys)
    this run did not produce (a partial run, e.g. `--rows tdmpc`, updates its rows and keeps the others,
    each with the machine it came from)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return rows
    keys = (key,) if isinstance(key, str) else key
    ran = {tuple(r.get(k) for k in keys) for r in rows}
    previous = json.loads(path.read_text())
    # A kept row names the machine it was measured on: the file's machine block is this run's.
    kept = [
        {"machine": previous["machine"], **r}
        for r in previous["rows"]
        if tuple(r.get(k) for k in keys) not in ran
    ]
    return kept + rows


def print_table(rows: list[dict], columns: list[str]) -> None:
    """Print rows as an aligned text table."""
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).rjust(widths[c]) for c in columns))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)
