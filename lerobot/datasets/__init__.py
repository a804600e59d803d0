"""Datasets: the generic API (importers by `dataset.format`, LeRobotDataset import/conversion and export, the
episode dataset with delta_timestamps windows, statistics, loaders, the cache directory).

PushT's own names live in its modules: `lerobot.datasets.pusht_import` (finding, fetching and converting
Diffusion Policy's zarr) and `lerobot.datasets.pusht_rules` (the env's keypoint and coverage rules).
"""

from lerobot.datasets.cache import default_cache_dir
from lerobot.datasets.episode_dataset import EpisodeDataset, collate_batch
from lerobot.datasets.factory import (
    IMPORTERS,
    StepBatchSampler,
    cycle_batches,
    dataset_fingerprint,
    import_dataset,
    make_dataloader,
    make_dataset,
    split_episodes,
)
from lerobot.datasets.lerobot_export import export_lerobot_dataset
from lerobot.datasets.lerobot_import import convert_lerobot_dataset, prepare_lerobot
from lerobot.errors import DatasetError, DatasetNotFoundError, DeltaTimestampsError

__all__ = [
    "IMPORTERS",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeDataset",
    "StepBatchSampler",
    "collate_batch",
    "convert_lerobot_dataset",
    "cycle_batches",
    "dataset_fingerprint",
    "default_cache_dir",
    "export_lerobot_dataset",
    "import_dataset",
    "make_dataloader",
    "make_dataset",
    "prepare_lerobot",
    "split_episodes",
]
