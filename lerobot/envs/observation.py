"""Turn a vector env's raw observation into the policy's batch of float32 tensors."""

from __future__ import annotations

import numpy as np
import torch

from lerobot.constants import OBS_ENV_STATE, OBS_IMAGE, OBS_STATE

# gym-pusht's observation keys -> our batch keys.
_KEY_MAP = {"pixels": OBS_IMAGE, "agent_pos": OBS_STATE, "environment_state": OBS_ENV_STATE}


def observation_to_batch(
    obs: dict | np.ndarray, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Convert a vector env observation into `{batch key: tensor}`.

    - `pixels` (B, H, W, 3) uint8 -> `observation.image` (B, 3, H, W) float32 in [0, 1]
    - `agent_pos` (B, 2) -> `observation.state` (B, 2) float32
    - `environment_state` (B, D) -> `observation.environment_state` (B, D) float32
    - a plain array observation (e.g. Pendulum's (B, 3)) -> `observation.state`

    The whole batch is converted at once: one copy per array, then one device transfer.
    """
    if not isinstance(obs, dict):
        obs = {"agent_pos": obs}
    batch = {}
    for key, value in obs.items():
        if key not in _KEY_MAP:
            raise KeyError(f"unexpected observation key {key!r}; known keys: {sorted(_KEY_MAP)}")
        tensor = torch.from_numpy(np.asarray(value))
        if key == "pixels":
            if tensor.ndim != 4 or tensor.shape[-1] != 3:
                raise ValueError(f"pixels must be (B, H, W, 3), got {tuple(tensor.shape)}")
            # Move the uint8 image first (4x fewer bytes), then scale on the device.
            tensor = tensor.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0)
        else:
            tensor = tensor.to(device, dtype=torch.float32, non_blocking=True)
        batch[_KEY_MAP[key]] = tensor
    return batch
