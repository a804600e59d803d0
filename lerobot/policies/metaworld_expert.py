"""MetaWorld's scripted experts (`metaworld.policies`) as a baseline policy: `policy=metaworld_expert`.

Evaluation runs it like any policy, so its success is the reference a learned policy is held against, and
`eval.record_dataset=DIR` turns its episodes into demonstrations. It reads the full 39-dim state
(`observation.environment_state`, MetaWorld's observation with the goal visible) and the task of each env
(`observation.task_index`), and returns the expert of that task's action for the current step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from lerobot.constants import OBS_ENV_STATE
from lerobot.errors import ConfigError
from lerobot.policies.baselines import BaselineConfig, Fits
from lerobot.policies.policy import Policy

OBS_TASK_INDEX = "observation.task_index"


@dataclass
class MetaWorldExpertConfig(BaselineConfig):
    """MetaWorld's hand-written expert of each task (no settings: it acts one step at a time)."""

    fits: ClassVar[Fits] = Fits(
        action_dim=4,
        needs_all=(OBS_ENV_STATE, OBS_TASK_INDEX),
        description="MetaWorld from state (env=metaworld: the 39-dim state and the task index)",
    )

    name: str = "metaworld_expert"


class MetaWorldExpertPolicy(Policy):
    """One action per env from `metaworld.policies.ENV_POLICY_MAP[task]().get_action(state)`.

    The task index counts MetaWorld's 50 task names in sorted order, as the env's `observation.task_index`
    does (lerobot/envs/metaworld.py).
    """

    def __init__(self, config: MetaWorldExpertConfig, dataset_stats: dict | None = None):
        super().__init__(n_obs_steps=1, n_action_steps=1)
        try:
            from metaworld.env_dict import ALL_V3_ENVIRONMENTS
            from metaworld.policies import ENV_POLICY_MAP
        except ImportError as e:
            raise ConfigError(
                "policy=metaworld_expert needs the `metaworld` package: pip install -e '.[mujoco]'"
            ) from e
        self.config = config
        tasks = sorted(ALL_V3_ENVIRONMENTS)
        self.experts = [ENV_POLICY_MAP[task]() for task in tasks]

    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, 1, 4): each env's expert action for its newest state."""
        states = batch[OBS_ENV_STATE][:, -1].double().numpy(force=True)  # (B, 39)
        tasks = batch[OBS_TASK_INDEX][:, -1].round().long().tolist()  # (B,)
        with warnings.catch_warnings():
            # The experts warn that their gains may exceed the action bounds; the clip below is the env's.
            warnings.filterwarnings("ignore", message="Constant", category=UserWarning)
            actions = np.stack(
                [self.experts[task].get_action(state) for task, state in zip(tasks, states, strict=True)]
            )
        return torch.from_numpy(np.clip(actions, -1.0, 1.0).astype(np.float32)).unsqueeze(1)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A scripted expert has nothing to learn."""
        raise NotImplementedError("the metaworld_expert policy is not trainable")
