"""Environments: the vector-env factory and the observation -> batch conversion."""

from lerobot.envs.factory import make_env, resolve_use_async
from lerobot.envs.observation import observation_to_batch

__all__ = ["make_env", "observation_to_batch", "resolve_use_async"]
