"""Baseline policies that need no training: evaluation works before any learned policy exists.

Each baseline's config declares the envs it fits (`Fits`: action size, bounds, observation features);
`validate()` checks them, so `policy=pusht_scripted env=pendulum` stops at config validation with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from lerobot.config import PolicyConfig
from lerobot.constants import OBS_ENV_STATE, OBS_IMAGE, OBS_STATE
from lerobot.errors import ConfigError
from lerobot.policies.policy import Policy


@dataclass(frozen=True)
class Fits:
    """The envs a baseline works on, stated by its config and checked at config validation."""

    # Size of the action vector; None: any. The action must have `low`/`high` bounds (baselines act within).
    action_dim: int | None = None
    # Observation features (batch keys) the env must provide: all of `needs_all`, at least one of `needs_any`.
    needs_all: tuple[str, ...] = ()
    needs_any: tuple[str, ...] = ()
    # What that means, for the error message.
    description: str = "any env with a bounded action"

    def check(self, cfg: PolicyConfig) -> None:
        """Raise `ConfigError` (one line: the policy, what it fits, what the env lacks) on a mismatch."""
        ((key, action),) = cfg.output_features.items()
        inputs = cfg.input_features
        problems = []
        if self.action_dim is not None and list(action.shape) != [self.action_dim]:
            problems.append(f"action {key!r} has shape {list(action.shape)}")
        if action.low is None or action.high is None:
            problems.append(f"action {key!r} has no low/high bounds")
        missing = [k for k in self.needs_all if k not in inputs]
        if missing:
            problems.append(f"observations lack {missing}")
        if self.needs_any and not any(k in inputs for k in self.needs_any):
            problems.append(f"observations have none of {list(self.needs_any)}")
        if problems:
            raise ConfigError(
                f"policy={cfg.name} fits {self.description}, but the env's {' and '.join(problems)}; "
                "pick another env or policy"
            )


def _bounds(cfg: PolicyConfig) -> tuple[Tensor, Tensor]:
    """(low, high) of the action, one value per dimension (bounds given once apply to every dimension)."""
    (feature,) = cfg.output_features.values()
    dim = feature.shape[0]
    low = torch.tensor(feature.low, dtype=torch.float32).expand(dim).clone()
    high = torch.tensor(feature.high, dtype=torch.float32).expand(dim).clone()
    return low, high


@dataclass
class BaselineConfig(PolicyConfig):
    """A baseline's config: `validate` also checks the env against the baseline's `fits`."""

    fits: ClassVar[Fits] = Fits()

    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent values or an env the baseline does not fit."""
        super().validate()
        self.fits.check(self)


@dataclass
class RandomConfig(BaselineConfig):
    """Uniformly random actions within the env's action bounds."""

    name: str = "random"
    seed: int = 0
    # I.i.d. actions, so a chunk of 8 is the same distribution as 8 single draws, at 1/8 of the calls.
    n_action_steps: int = 8


class RandomPolicy(Policy):
    """Samples actions uniformly in the action bounds: from each env's episode stream when it has one
    (`Policy.noise_generators`), else from its own seeded generator."""

    def __init__(self, config: RandomConfig, dataset_stats: dict | None = None):
        super().__init__(
            n_obs_steps=config.n_obs_steps,
            n_action_steps=config.n_action_steps,
            temporal_ensemble_coeff=config.temporal_ensemble_coeff,
        )
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
        shape = (self.n_action_steps, len(self.low_np))
        generators = self.noise_generators()
        if generators is None:
            actions = self.rng.random((batch_size, *shape), dtype=np.float32)
        else:  # each env's episode stream (evaluation), row by row: what torch.rand(shape, generator=g) draws
            actions = np.empty((batch_size, *shape), dtype=np.float32)
            for row, generator in zip(torch.from_numpy(actions), generators, strict=True):
                row.uniform_(generator=generator)
        actions *= self.span_np
        actions += self.low_np
        chunk = torch.from_numpy(actions)
        low = self.low
        return chunk if low.is_cpu else chunk.to(low.device)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A random policy has nothing to learn."""
        raise NotImplementedError("the random policy is not trainable")


@dataclass
class ScriptedConfig(BaselineConfig):
    """A hand-written PushT pusher: walk to the block and push it through its centre toward the goal."""

    fits: ClassVar[Fits] = Fits(
        action_dim=2,
        needs_all=(OBS_STATE,),
        needs_any=(OBS_ENV_STATE, OBS_IMAGE),
        description="PushT-like envs (a bounded 2-D action; the agent's position plus block keypoints or an image)",
    )

    name: str = "pusht_scripted"
    goal_xy: list[float] = field(default_factory=lambda: [256.0, 256.0])
    # How far past the block centre (world units) the agent aims, along the block -> goal direction.
    push_lead: float = 20.0
    # Block colour in rendered images (pygame's LightSlateGray) and the tolerance used to find it.
    block_rgb: list[float] = field(default_factory=lambda: [119.0, 136.0, 153.0])
    color_tolerance: float = 30.0
    world_size: float = 512.0


class ScriptedPushPolicy(Policy):
    """Deterministic baseline: aim just past the block's centre on the side facing the goal.

    The block centre is the mean of the 8 keypoints (`observation.environment_state`) or, from pixels, the
    centroid of block-coloured pixels in `observation.image`.
    """

    def __init__(self, config: ScriptedConfig, dataset_stats: dict | None = None):
        super().__init__(
            n_obs_steps=1, n_action_steps=1, temporal_ensemble_coeff=config.temporal_ensemble_coeff
        )
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
