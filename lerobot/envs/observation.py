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

    The whole batch is converted at once, with one pass over each array. On the CPU a float32 array is
    used as is (no copy), so the tensors may share memory with `obs`; the `Policy` base class copies
    what it keeps across steps.
    """
    if not isinstance(obs, dict):
        obs = {"agent_pos": obs}
    on_cpu = getattr(device, "type", device) == "cpu"  # torch.device(...) would cost more than the copy
    batch = {}
    for key, value in obs.items():
        if key not in _KEY_MAP:
            raise KeyError(f"unexpected observation key {key!r}; known keys: {sorted(_KEY_MAP)}")
        value = np.asarray(value)
        if key == "pixels":
            if value.ndim != 4 or value.shape[-1] != 3:
                raise ValueError(f"pixels must be (B, H, W, 3), got {value.shape}")
            if on_cpu:
                # Scaled as the dataset scales; the result is a channels-last view (B, 3, H, W).
                scaled = np.divide(value, np.float32(255.0), dtype=np.float32)
                tensor = torch.from_numpy(scaled).permute(0, 3, 1, 2)
            else:
                # Move the uint8 image first (4x fewer bytes), then scale on the device.
                tensor = torch.from_numpy(value).to(device, non_blocking=True)
                tensor = tensor.permute(0, 3, 1, 2).float().div_(255.0)
        elif on_cpu:
            tensor = torch.from_numpy(value.astype(np.float32, copy=False))
        else:
            tensor = torch.from_numpy(value).to(device, dtype=torch.float32, non_blocking=True)
        batch[_KEY_MAP[key]] = tensor
    return batch
