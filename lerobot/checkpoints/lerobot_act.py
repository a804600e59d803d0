"""Load a LeRobot (0.4 - 0.6) ACT `pretrained_model` directory into this project's `ACTPolicy`.

LeRobot saves `config.json` (its `ACTConfig`), `model.safetensors` and the normalization statistics in its
processor files (read by `lerobot_common`). This project's `ACTPolicy` builds its network under LeRobot's
module names (`model.backbone.*`, the torchvision ResNet up to `layer4` with frozen BatchNorm buffers;
`model.encoder.*`, `model.decoder.*`, `model.vae_encoder.*`, the input projections and position
embeddings) and computes the same function, so the weights load name for name: nothing is renamed or
reshaped. The encoder's tokens are in the same order, `[latent, state, env_state, camera pixels]`.

The config fields have the same names and meanings; `pretrained_backbone_weights` is dropped (the ResNet's
weights come from the checkpoint, nothing is downloaded). The statistics are those of the processor
files: for cameras, ImageNet's mean and std when LeRobot's training used its default
(`dataset.use_imagenet_stats=true`), which it stores there in place of the dataset's.

Refused, with one line naming the field: a non-ResNet backbone; a robot state under another key than
`observation.state`, an environment state under another key than `observation.environment_state` (LeRobot's
ACT reads those keys only) or more than one; an action feature not named `action`; an activation other
than relu or gelu; quantile normalization; PEFT adapters; processor steps other than an empty rename,
batching, device and (un)normalization; unknown (newer) or missing config fields; checkpoints before 0.4.
What the config itself cannot hold (e.g. `n_obs_steps` other than 1, `temporal_ensemble_coeff` with
`n_action_steps` > 1) is refused by `ACTConfig.validate`, naming the field too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from lerobot.checkpoints.hub import PretrainedSpec
from lerobot.checkpoints.lerobot_common import (
    lerobot_spec,
    load_lerobot_policy,
    policy_section,
    read_config_features,
    refuse,
)
from lerobot.config import FeatureConfig, PolicyConfig
from lerobot.constants import ACTION, ACTION_KIND, ENV_STATE, OBS_ENV_STATE, OBS_STATE, STATE, VISUAL

LEROBOT_TYPE = "act"
SOURCE = "lerobot-0.6-act"

# Fields with the same name and meaning in both configs.
_COPIED = (
    "n_obs_steps",
    "chunk_size",
    "n_action_steps",
    "vision_backbone",
    "replace_final_stride_with_dilation",
    "pre_norm",
    "dim_model",
    "n_heads",
    "dim_feedforward",
    "feedforward_activation",
    "n_encoder_layers",
    "n_decoder_layers",
    "use_vae",
    "latent_dim",
    "n_vae_encoder_layers",
    "temporal_ensemble_coeff",
    "dropout",
    "kl_weight",
    "optimizer_lr",
    "optimizer_weight_decay",
    "optimizer_lr_backbone",
)
# Fields read by the conversion itself (checked, translated or dropped on purpose).
_HANDLED = (
    "type",
    "input_features",
    "output_features",
    "normalization_mapping",
    "pretrained_backbone_weights",
    "use_peft",
)
_ACTIVATIONS = ("relu", "gelu")
# The batch keys LeRobot's ACT reads its vector inputs and its output from.
_VECTOR_KEYS = {STATE: OBS_STATE, ENV_STATE: OBS_ENV_STATE, ACTION_KIND: ACTION}


def _check_features(features: dict[str, FeatureConfig], where: Path) -> None:
    """Refuse vector features that LeRobot's ACT would not read under their key (it reads
    `observation.state`, `observation.environment_state` and `action` only), and so several of one kind."""
    for key, feature in features.items():
        wanted = _VECTOR_KEYS.get(feature.kind)
        if wanted is not None and key != wanted:
            group = "output_features" if feature.kind == ACTION_KIND else "input_features"
            raise refuse(
                where,
                f"{group}.{key}",
                feature.kind,
                f"LeRobot's ACT reads its {feature.kind} as {wanted!r} only",
            )


def _check_modules(config: dict[str, Any], features: dict[str, FeatureConfig], where: Path) -> None:
    """Refuse a vision trunk or an activation this project's ACT does not have."""
    backbone = config["vision_backbone"]
    if any(f.kind == VISUAL for f in features.values()) and not str(backbone).startswith("resnet"):
        raise refuse(where, "vision_backbone", backbone, "only torchvision ResNets map")
    activation = config["feedforward_activation"]
    if activation not in _ACTIVATIONS:
        raise refuse(
            where, "feedforward_activation", activation, f"this project's ACT has {list(_ACTIVATIONS)}"
        )


def convert_config(config: dict[str, Any], where: Path) -> tuple[dict[str, Any], dict[str, FeatureConfig]]:
    """LeRobot's ACT `config.json` content -> (this project's `policy` section, the features).

    Raises `PretrainedError` naming the first field that cannot be mapped.
    """
    features = read_config_features(config, _HANDLED, _COPIED, where)
    _check_features(features, where)
    _check_modules(config, features, where)
    # LeRobot types it as an int defaulting to False.
    dilation = bool(config["replace_final_stride_with_dilation"])
    section = policy_section(
        "act", config, _COPIED, features, where, replace_final_stride_with_dilation=dilation
    )
    return section, features


def read_spec(directory: Path, config: dict[str, Any]) -> PretrainedSpec:
    """The spec of a LeRobot ACT `pretrained_model` directory, from its `config.json` content `config`."""
    return lerobot_spec(directory, config, convert_config, SOURCE)


def load_weights(spec: PretrainedSpec, policy_cfg: PolicyConfig) -> nn.Module:
    """This project's policy of `policy_cfg` (converted from the LeRobot config of `spec`) with the LeRobot
    weights and normalization statistics of its directory: the names already match."""
    return load_lerobot_policy(spec, policy_cfg, "act", "ACT")
