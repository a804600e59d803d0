"""Datasets: PushT and LeRobotDataset import/conversion (and LeRobotDataset export), the episode dataset with delta_timestamps windows, statistics, loaders."""

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
from lerobot.datasets.pusht_import import (
    PUSHT_URL,
    convert_pusht_zarr,
    default_cache_dir,
    find_pusht_source,
    prepare_pusht,
)
from lerobot.datasets.pusht_rules import block_coverage, block_keypoints, coverage_reward
from lerobot.errors import DatasetError, DatasetNotFoundError, DeltaTimestampsError

__all__ = [
    "IMPORTERS",
    "PUSHT_URL",
    "DatasetError",
    "DatasetNotFoundError",
    "DeltaTimestampsError",
    "EpisodeDataset",
    "StepBatchSampler",
    "block_coverage",
    "block_keypoints",
    "collate_batch",
    "convert_lerobot_dataset",
    "convert_pusht_zarr",
    "coverage_reward",
    "cycle_batches",
    "dataset_fingerprint",
    "default_cache_dir",
    "export_lerobot_dataset",
    "find_pusht_source",
    "import_dataset",
    "make_dataloader",
    "make_dataset",
    "prepare_lerobot",
    "prepare_pusht",
    "split_episodes",
]
