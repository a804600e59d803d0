"""The torch device a run asks for (`device=`), checked against this machine and described in one line."""

from __future__ import annotations

import logging

import torch

from lerobot.errors import ConfigError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """The torch device that `device=<name>` asks for (see `RootConfig.device`), set up for use.

    `auto` picks CUDA when a GPU is present, else MPS (Apple GPU) where available, else the CPU. A named device
    that this machine lacks (`cuda` without a GPU, `cuda:1` with one GPU, `mps` off a Mac) is a config error.
    On CUDA, float32 matmuls and convolutions use TF32 (bf16 autocast is `training.use_amp`).
    """
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA GPU(s) (cuda:0..cuda:{count - 1})" if count else "no CUDA GPU"
            raise ConfigError(f"device={name} but this machine has {have}; use device=auto or device=cpu")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device={name} but MPS (Apple GPU) is not available here; use device=auto or device=cpu"
        )
    log.info("device: %s", describe_device(device))
    return device


def describe_device(device: torch.device) -> str:
    """`device` as the start-up line shows it, e.g. `cuda:0 (NVIDIA H200)` or `cpu (2 threads)`."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)}, TF32 matmuls)"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)
