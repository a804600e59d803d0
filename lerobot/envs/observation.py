"""From an env's own observation to the policy's batch.

Two steps. `BatchKeyObservation` (in the torch-free `lerobot.envs.worker`, as it runs in env worker
processes), a gymnasium wrapper that `make_env` puts around every env, renames the env's (possibly nested)
observation into a flat dict keyed by batch keys, as `env.observation_keys` says; it only picks entries,
never copies. `observation_to_batch` then turns a vector env's batched observation into float32 tensors
by their layout.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


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
