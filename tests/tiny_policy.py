"""A tiny policy in its own module, added to lerobot with one `register_policy` call (see test_extension.py).

It reads a camera and the state through their batch keys: action = (mean brightness of the newest
`observation.images.top`, first element of the newest `observation.state`), repeated over the chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lerobot.config import InferenceConfig, PolicyConfig
from lerobot.policies.policy import Policy

IMAGE_KEY = "observation.images.top"
STATE_KEY = "observation.state"


@dataclass
class TinyConfig(PolicyConfig):
    """Two observation steps in, chunks of two actions out."""

    name: str = "tiny"
    n_obs_steps: int = 2
    n_action_steps: int = 2
    gain: float = 1.0


class TinyPolicy(Policy):
    """See the module docstring; `seen` records the shapes of every batch it predicted from."""

    def __init__(self, config: TinyConfig, dataset_stats: dict | None = None):
        super().__init__(n_obs_steps=config.n_obs_steps, n_action_steps=config.n_action_steps)
        self.config = config
        self.gain = nn.Parameter(torch.tensor(config.gain))
        self.seen: list[dict[str, tuple[int, ...]]] = []

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, n_action_steps, 2)."""
        self.seen.append({k: tuple(v.shape) for k, v in batch.items()})
        brightness = batch[IMAGE_KEY][:, -1].mean(dim=(1, 2, 3)) * self.gain
        action = torch.stack([brightness, batch[STATE_KEY][:, -1, 0]], dim=1)
        return action.unsqueeze(1).repeat(1, self.n_action_steps, 1)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Squared error of the first predicted action against the batch's."""
        predicted = self.predict_action_chunk(batch)[:, 0]
        return {"loss": ((predicted - batch["action"][:, 0]) ** 2).mean()}


ENTERED: list[str] = []


@contextlib.contextmanager
def recording_context(policy: Policy, settings: InferenceConfig) -> Iterator[None]:
    """An `inference` layer for tests: records that evaluation entered it (whatever `settings` say)."""
    ENTERED.append(policy.config.name)
    yield
