"""Environments: the vector-env factory, the observation-key wrapper and the observation -> batch conversion."""

from lerobot.envs.factory import make_env, make_single_env, resolve_use_async
from lerobot.envs.observation import BatchKeyObservation, observation_to_batch

__all__ = ["BatchKeyObservation", "make_env", "make_single_env", "observation_to_batch", "resolve_use_async"]
