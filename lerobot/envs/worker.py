"""What an async env worker process runs: build one env whose observations are keyed by batch keys.

This module must stay torch-free, and so must everything it imports (`lerobot.config`,
`lerobot.constants`, gymnasium, numpy): an `AsyncVectorEnv` worker unpickles `build_env`, which imports
this module, and a torch import would load all of torch into every worker, many times the memory the
worker needs otherwise.
`tests/test_env_faults.py` checks that a worker's `sys.modules` holds no torch.
"""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Mapping

import gymnasium as gym
from gymnasium import spaces

from lerobot.config import WHOLE_OBSERVATION
from lerobot.errors import ConfigError
from lerobot.runtime.signals import ignore_stop_signals

PATH_SEPARATOR = "/"


def _split(path: str) -> tuple[str, ...]:
    return () if path == WHOLE_OBSERVATION else tuple(path.split(PATH_SEPARATOR))


def observation_paths(space: spaces.Space) -> list[str]:
    """Every leaf of an observation space as an `env.observation_keys` path (`.` for a non-dict space)."""
    if not isinstance(space, spaces.Dict):
        return [WHOLE_OBSERVATION]
    paths = []
    for key, sub in space.spaces.items():
        if isinstance(sub, spaces.Dict):
            paths += [f"{key}{PATH_SEPARATOR}{p}" for p in observation_paths(sub)]
        else:
            paths.append(key)
    return paths


class BatchKeyObservation(gym.ObservationWrapper):
    """Observations as `{batch key: array}`, picked from the env's observation by `observation_keys`.

    Args:
        env: the env to wrap.
        observation_keys: env observation path -> batch key; a path is `key` or `key/subkey/...` into
            nested dicts, or `.` for an env whose whole observation is one array.

    Raises `ConfigError` naming the path (and the paths the env has) when a path does not exist.
    """

    def __init__(self, env: gym.Env, observation_keys: Mapping[str, str]):
        super().__init__(env)
        self._routes = [(_split(path), key) for path, key in observation_keys.items()]
        picked = {}
        for (parts, key), path in zip(self._routes, observation_keys):
            space = env.observation_space
            for part in parts:
                if not isinstance(space, spaces.Dict) or part not in space.spaces:
                    raise ConfigError(
                        f"env.observation_keys: {env.spec.id if env.spec else env} has no observation "
                        f"{path!r}; its observation paths are {observation_paths(env.observation_space)}"
                    )
                space = space.spaces[part]
            picked[key] = space
        self.observation_space = spaces.Dict(picked)

    def observation(self, observation):
        """The picked entries, under their batch keys (the same arrays, not copies)."""
        out = {}
        for parts, key in self._routes:
            value = observation
            for part in parts:
                value = value[part]
            out[key] = value
        return out


def env_module(gym_id: str) -> str | None:
    """The module whose import registers `gym_id`: gymnasium's `module:EnvName-v0` form names it (a module
    inside a package, e.g. `lerobot.envs.dmc:lerobot/DMC-v0`), else the namespace of `namespace/EnvName-v0`
    (`gym_pusht`); None for an id gymnasium registers itself (`Pendulum-v1`)."""
    if ":" in gym_id:
        return gym_id.split(":")[0]
    return gym_id.split("/")[0] if "/" in gym_id else None


def registered_id(gym_id: str) -> str:
    """`gym_id` as gymnasium's registry holds it (without a `module:` prefix)."""
    return gym_id.split(":")[-1]


def build_worker_env(*args: object) -> gym.Env:
    """`build_env` for an async worker process: the worker ignores the stop signals sent to the whole
    process group (the main process stops first, saving what it must, then ends its workers).

    `AsyncVectorEnv` also calls it once in the main process (a throwaway env for the spaces), which must
    keep its handlers."""
    if multiprocessing.parent_process() is not None:
        ignore_stop_signals()
    return build_env(*args)


def build_env(
    gym_id: str,
    max_episode_steps: int,
    gym_kwargs: dict,
    render_mode: str | None,
    observation_keys: dict[str, str],
) -> gym.Env:
    """Create one env with batch-keyed observations; runs inside async workers too, so it imports the
    env's package itself."""
    module = env_module(gym_id)
    if module is not None:
        # Registering the id (e.g. `gym_pusht/PushT-v0`) is a side effect of importing its package.
        importlib.import_module(module)
    kwargs = dict(gym_kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env = gym.make(gym_id, max_episode_steps=max_episode_steps, disable_env_checker=True, **kwargs)
    return BatchKeyObservation(env, observation_keys)
