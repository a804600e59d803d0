"""Baseline policies that need no training: evaluation works before any learned policy exists."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from lerobot.config import ConfigError
from lerobot.constants import ENV_STATE, OBS_ENV_STATE, OBS_IMAGE, OBS_STATE, VISUAL
from lerobot.policies.config import PolicyConfig
from lerobot.policies.policy import Policy


def _bounds(cfg: PolicyConfig) -> tuple[Tensor, Tensor]:
    (feature,) = cfg.output_features.values()
    if feature.low is None or feature.high is None:
        raise ConfigError("this baseline needs `low`/`high` bounds on the env's action feature")
    dim = feature.shape[0]
    low = torch.tensor(feature.low, dtype=torch.float32).expand(dim).clone()
    high = torch.tensor(feature.high, dtype=torch.float32).expand(dim).clone()
    return low, high


@dataclass
class RandomConfig(PolicyConfig):
    """Uniformly random actions within the env's action bounds."""

    name: str = "random"
    seed: int = 0
    # I.i.d. actions, so a chunk of 8 is the same distribution as 8 single draws, at 1/8 of the calls.
    n_action_steps: int = 8


class RandomPolicy(Policy):
    """Samples actions uniformly in the action bounds from its own seeded generator."""

    def __init__(self, config: RandomConfig, dataset_stats: dict | None = None):
        super().__init__(n_obs_steps=config.n_obs_steps, n_action_steps=config.n_action_steps)
        self.config = config
        low, high = _bounds(config)
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.on_reset(None)

    def on_reset(self, env_ids: Tensor | None) -> None:
        """A full reset reseeds the generator (every evaluation sees the same actions) and reads the bounds.

        The bounds are copied to numpy here, not at every chunk, so a loaded state dict applies from the
        next full reset (every evaluation starts with one).
        """
        if env_ids is None and hasattr(self, "low"):  # the base class resets before the buffers exist
            # numpy's generator: a draw costs a fraction of a seeded torch.rand; the policy is a speed probe.
            self.rng = np.random.default_rng(self.config.seed)
            self.low_np = self.low.numpy(force=True)
            self.span_np = self.high.numpy(force=True) - self.low_np

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, n_action_steps, action_dim) uniform actions."""
        batch_size = next(iter(batch.values())).shape[0]
        actions = self.rng.random((batch_size, self.n_action_steps, len(self.low_np)), dtype=np.float32)
        actions *= self.span_np
        actions += self.low_np
        chunk = torch.from_numpy(actions)
        low = self.low
        return chunk if low.is_cpu else chunk.to(low.device)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A random policy has nothing to learn."""
        raise NotImplementedError("the random policy is not trainable")


@dataclass
class ScriptedConfig(PolicyConfig):
    """A hand-written PushT pusher: walk to the block and push it through its centre toward the goal."""

    name: str = "scripted"
    goal_xy: list[float] = field(default_factory=lambda: [256.0, 256.0])
    # How far past the block centre (world units) the agent aims, along the block -> goal direction.
    push_lead: float = 20.0
    # Block colour in rendered images (pygame's LightSlateGray) and the tolerance used to find it.
    block_rgb: list[float] = field(default_factory=lambda: [119.0, 136.0, 153.0])
    color_tolerance: float = 30.0
    world_size: float = 512.0

    def validate(self) -> None:
        """The pusher locates the block from keypoints or from the image."""
        super().validate()
        kinds = {f.kind for f in self.input_features.values()}
        if ENV_STATE not in kinds and VISUAL not in kinds:
            raise ConfigError(
                "the scripted policy needs block keypoints or an image among the env's features"
            )


class ScriptedPushPolicy(Policy):
    """Deterministic baseline: aim just past the block's centre on the side facing the goal.

    The block centre is the mean of the 8 keypoints (`observation.environment_state`) or, from pixels, the
    centroid of block-coloured pixels in `observation.image`.
    """

    def __init__(self, config: ScriptedConfig, dataset_stats: dict | None = None):
        super().__init__(n_obs_steps=1, n_action_steps=1)
        self.config = config
        low, high = _bounds(config)
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("goal", torch.tensor(config.goal_xy, dtype=torch.float32))
        self.register_buffer("block_rgb", torch.tensor(config.block_rgb, dtype=torch.float32) / 255.0)

    def block_center(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, 2) block centre in world coordinates from the newest observation."""
        if OBS_ENV_STATE in batch:
            keypoints = batch[OBS_ENV_STATE][:, -1].reshape(batch[OBS_ENV_STATE].shape[0], -1, 2)
            return keypoints.mean(dim=1)
        image = batch[OBS_IMAGE][:, -1]  # (B, 3, H, W)
        distance = (image - self.block_rgb.view(1, 3, 1, 1)).abs().amax(dim=1)  # (B, H, W)
        mask = (distance < self.config.color_tolerance / 255.0).float()
        height, width = mask.shape[-2:]
        rows = torch.arange(height, device=mask.device, dtype=torch.float32) + 0.5
        cols = torch.arange(width, device=mask.device, dtype=torch.float32) + 0.5
        count = mask.sum(dim=(1, 2)).clamp_min(1.0)
        y = (mask.sum(dim=2) * rows).sum(dim=1) / count * self.config.world_size / height
        x = (mask.sum(dim=1) * cols).sum(dim=1) / count * self.config.world_size / width
        center = torch.stack([x, y], dim=1)
        # No block pixel found: stay where the agent is.
        return torch.where((mask.sum(dim=(1, 2)) > 0).unsqueeze(1), center, batch[OBS_STATE][:, -1])

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, 1, 2): the push target."""
        center = self.block_center(batch)
        direction = self.goal - center
        direction = direction / direction.norm(dim=1, keepdim=True).clamp_min(1e-6)
        target = center + self.config.push_lead * direction
        return torch.clamp(target, self.low, self.high).unsqueeze(1)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A scripted policy has nothing to learn."""
        raise NotImplementedError("the scripted policy is not trainable")
