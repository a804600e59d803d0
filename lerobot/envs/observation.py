"""From an env's own observation to the policy's batch.

Two steps. `BatchKeyObservation`, a gymnasium wrapper that `make_env` puts around every env, renames
the env's (possibly nested) observation into a flat dict keyed by batch keys, as `env.observation_keys`
says; it only picks entries, never copies. `observation_to_batch` then turns a vector env's batched
observation into float32 tensors by their layout.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from lerobot.config import WHOLE_OBSERVATION, ConfigError

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


def observation_to_batch(
    obs: Mapping[str, np.ndarray], device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Convert a batched observation `{batch key: (B, ...) array}` into float32 tensors, by layout.

    - an image, (B, H, W, C) uint8 -> (B, C, H, W) float32 in [0, 1] (scaled as the dataset scales)
    - anything else (vectors) -> float32 of the same shape

    The tensors own their memory: they never alias `obs`, whose arrays may be the vector env's buffers
    that the next step overwrites (`make_env(copy=False)`), so a policy may keep them. Each array is read
    once: the conversion itself is the copy.
    """
    on_cpu = getattr(device, "type", device) == "cpu"  # torch.device(...) would cost more than the copy
    batch = {}
    for key, value in obs.items():
        value = np.asarray(value)
        if value.ndim == 4 and value.dtype == np.uint8:
            if on_cpu:
                # The result is a channels-last view (B, C, H, W) of the fresh float32 array.
                scaled = np.divide(value, np.float32(255.0), dtype=np.float32)
                tensor = torch.from_numpy(scaled).permute(0, 3, 1, 2)
            else:
                # Move the uint8 image first (4x fewer bytes), then scale on the device into a new tensor.
                tensor = torch.from_numpy(value).to(device).permute(0, 3, 1, 2).float().div_(255.0)
        elif on_cpu:
            tensor = torch.from_numpy(np.array(value, dtype=np.float32))  # np.array copies, always
        else:
            tensor = torch.from_numpy(value).to(device, dtype=torch.float32)
        batch[key] = tensor
    return batch
