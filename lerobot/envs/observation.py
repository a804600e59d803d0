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


def is_image(value: np.ndarray) -> bool:
    """Whether a batched observation entry is an image by its layout: (B, H, W, C) uint8."""
    return value.ndim == 4 and value.dtype == np.uint8


def channels_first(image: np.ndarray) -> torch.Tensor:
    """A (B, H, W, C) image array as a (B, C, H, W) tensor: a view of its memory, not a copy."""
    return torch.from_numpy(image).permute(0, 3, 1, 2)


def image_to_float(image: torch.Tensor) -> torch.Tensor:
    """uint8 images (any shape) -> float32 in [0, 1], k / 255, into new memory of the same layout; the one scaling
    of env images (the dataset divides its frames the same way)."""
    return image.to(torch.float32).div_(255.0)


def observation_to_batch(
    obs: Mapping[str, np.ndarray], device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Convert a batched observation `{batch key: (B, ...) array}` into float32 tensors, by layout.

    - an image (`is_image`), (B, H, W, C) uint8 -> (B, C, H, W) float32 in [0, 1] (`image_to_float`)
    - anything else (vectors) -> float32 of the same shape

    The tensors own their memory: they never alias `obs`, whose arrays may be the vector env's buffers
    that the next step overwrites (`make_env(copy=False)`), so a policy may keep them. Each array is read
    once: the conversion itself is the copy.
    """
    on_cpu = getattr(device, "type", device) == "cpu"  # torch.device(...) would cost more than the copy
    batch = {}
    for key, value in obs.items():
        value = np.asarray(value)
        if is_image(value):
            image = channels_first(value)
            # On a device, the uint8 image moves first (4x fewer bytes) and is scaled there. The result keeps
            # the env's channels-last memory order, as a (B, C, H, W) view.
            tensor = image_to_float(image if on_cpu else image.to(device))
        elif on_cpu:
            tensor = torch.from_numpy(np.array(value, dtype=np.float32))  # np.array copies, always
        else:
            tensor = torch.from_numpy(value).to(device, dtype=torch.float32)
        batch[key] = tensor
    return batch
