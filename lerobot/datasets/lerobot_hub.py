"""Where a LeRobotDataset comes from, for `dataset.format=lerobot` (first match wins; `find_lerobot_source`):

1. `dataset.root`: the dataset directory itself (holds `meta/info.json`). Set but without it is an error.
2. `$HF_LEROBOT_HOME/<repo_id>` (default `~/.cache/huggingface/lerobot/<repo_id>`): where LeRobot keeps
   datasets it records or that are put there by hand.
3. The huggingface_hub cache: `snapshot_download(repo_id, repo_type="dataset", revision=dataset.revision)`,
   first offline, then downloading. Offline with nothing cached is one `DatasetNotFoundError` line naming
   the repo and the directory to put it in.

The repo id names directories, so it must be a hub id `<owner>/<name>` (`lerobot.config.check_repo_id`), and
every directory derived from it lies under its root (`repo_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lerobot.config import DatasetConfig, check_repo_id
from lerobot.datasets.lerobot_format import INFO_PATH
from lerobot.errors import ConfigError, DatasetNotFoundError
from lerobot.runtime.files import path_within

# The hub revision LeRobot 0.4-0.6 loads (datasets are tagged with their codebase version).
DEFAULT_REVISION = "v3.0"


def lerobot_home() -> Path:
    """LeRobot's local dataset directory: `$HF_LEROBOT_HOME`, else `$HF_HOME/lerobot` (`~/.cache/huggingface/lerobot`)."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "lerobot"


def find_lerobot_source(dataset_cfg: DatasetConfig) -> Path:
    """The directory of the LeRobotDataset `dataset_cfg` names (see the module docstring for the order).

    Raises:
        ConfigError: neither `dataset.root` nor `dataset.repo_id` is set, or the repo id is no hub id.
        DatasetNotFoundError: `dataset.root` holds no dataset, or it is neither local nor downloadable.
    """
    if dataset_cfg.root:
        root = Path(dataset_cfg.root).expanduser()
        if (root / INFO_PATH).is_file():
            return root
        if not root.exists():
            raise DatasetNotFoundError(
                f"dataset.root={dataset_cfg.root}: no such directory; point dataset.root at a LeRobotDataset, or "
                "record one first (scripts/eval.py policy=<expert or checkpoint> env=<env> "
                "eval.record_dataset=DIR; docs/metaworld.md records MetaWorld's experts)"
            )
        raise DatasetNotFoundError(
            f"dataset.root={dataset_cfg.root}: no {INFO_PATH}; point dataset.root at the LeRobotDataset directory "
            "(the one holding meta/, data/, videos/)"
        )
    repo_id = dataset_cfg.repo_id
    if not repo_id:
        raise ConfigError(
            "dataset.format=lerobot needs dataset.repo_id (e.g. lerobot/pusht) or dataset.root=DIR"
        )
    local = repo_dir(lerobot_home(), repo_id)
    if (local / INFO_PATH).is_file():
        return local
    return _hub_snapshot(repo_id, dataset_cfg.revision or DEFAULT_REVISION, local)


def repo_dir(root: Path, repo_id: str) -> Path:
    """`root/<repo_id>`, the directory of dataset `repo_id` under `root` (LeRobot's home, the conversions'
    cache); a repo id that is no hub id `<owner>/<name>` is a `ConfigError` (`check_repo_id`).

    Raises:
        ConfigError: the repo id is malformed, or the directory would not lie inside `root`.
    """
    check_repo_id(repo_id)
    path = path_within(root, repo_id)
    if path is None:  # checked apart from the id's rule: a path derived from a setting stays under its root
        raise ConfigError(f"dataset.repo_id={repo_id!r} names a directory outside {root}; use <owner>/<name>")
    return path


def _hub_snapshot(repo_id: str, revision: str, local: Path) -> Path:
    """The hub snapshot of `repo_id` at `revision`: from the huggingface_hub cache, else downloaded."""
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises several types for that)
        pass
    try:
        path = Path(snapshot_download(repo_id, repo_type="dataset", revision=revision))
    except Exception as e:  # offline, unknown repo or revision, HTTP errors: all mean "not available"
        reason = (str(e).splitlines() or [""])[0].split(". ")[0][:200]
        raise DatasetNotFoundError(
            f"LeRobotDataset {repo_id} (revision {revision}) is not in the hub cache {constants.HF_HUB_CACHE} and "
            f"could not be downloaded ({type(e).__name__}: {reason}); put the dataset directory at {local} "
            "or set dataset.root=DIR to a directory holding meta/info.json"
        ) from None
    if not (path / INFO_PATH).is_file():
        raise DatasetNotFoundError(
            f"hub dataset {repo_id}@{revision}: no {INFO_PATH}; it is not a LeRobotDataset"
        )
    return path
