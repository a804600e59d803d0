"""Environments: the vector-env factory, the observation-key wrapper and the observation -> batch conversion.

Importing this package does not import torch (`observation_to_batch` loads on first use): async env
workers import it to build their env and must stay torch-free (see `lerobot.envs.worker`).
"""

from typing import Any

from lerobot.envs.factory import make_env, make_single_env, resolve_use_async
from lerobot.envs.faults import close_now
from lerobot.envs.worker import BatchKeyObservation
from lerobot.errors import EnvWorkerError

__all__ = [
    "BatchKeyObservation",
    "EnvWorkerError",
    "close_now",
    "make_env",
    "make_single_env",
    "observation_to_batch",
    "resolve_use_async",
]


def __getattr__(name: str) -> Any:
    if name == "observation_to_batch":
        from lerobot.envs.observation import observation_to_batch

        return observation_to_batch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
