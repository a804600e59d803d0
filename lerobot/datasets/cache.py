"""The cache directory every dataset importer downloads into and converts into (`<cache>/<importer's dir>`)."""

from __future__ import annotations

import os
from pathlib import Path

from lerobot.config import DatasetConfig


def default_cache_dir(dataset_cfg: DatasetConfig | None = None) -> Path:
    """`dataset.cache_dir`, else `$XDG_CACHE_HOME/lerobot`, else `~/.cache/lerobot`."""
    if dataset_cfg is not None and dataset_cfg.cache_dir:
        return Path(dataset_cfg.cache_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lerobot"
