"""The cache directory every dataset importer downloads into and converts into (`<cache>/<importer's dir>`)."""

from __future__ import annotations

from pathlib import Path

from lerobot.config import DatasetConfig
from lerobot.runtime.files import user_cache_dir


def default_cache_dir(dataset_cfg: DatasetConfig | None = None) -> Path:
    """`dataset.cache_dir`, else `$XDG_CACHE_HOME/lerobot`, else `~/.cache/lerobot`."""
    if dataset_cfg is not None and dataset_cfg.cache_dir:
        return Path(dataset_cfg.cache_dir).expanduser()
    return user_cache_dir()
