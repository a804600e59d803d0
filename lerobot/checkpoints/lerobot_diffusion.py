"""Load a LeRobot (0.4 - 0.6) Diffusion Policy `pretrained_model` directory into this project's `DiffusionPolicy`.

LeRobot saves `config.json` (its `DiffusionConfig`), `model.safetensors` (its module names) and, since 0.4,
the normalization statistics only in its processor pipelines (read by `lerobot_common`). Both networks
compute the same function once the names are mapped (see docs/pretrained_policies.md for the table):

- U-Net: `diffusion.unet.{diffusion_step_encoder, down_modules, mid_modules, up_modules, final_conv}` ->
  `unet.{step_encoder, down, mid, up, final}`; inside the blocks `conv{1,2}.block.<i>` -> `conv{1,2}.<i>`,
  `cond_encoder` -> `film`, `residual_conv` -> `skip`. Conv1d weights `(C_out, C_in, k)` become the
  `(C_out, C_in * k)` matrices of `TemporalConv1d` (a view of the same numbers).
- Conditioning order: per observation step LeRobot concatenates `[state, image features, env_state]`, this
  project `[state, env_state, image features]`; with both inputs the columns of every FiLM layer's input
  weight are reordered to match (`conditioning_order`).
- Image encoder: the ResNet keeps its names (`backbone.*`, BatchNorm names even where GroupNorm replaced
  it), `pool.nets` -> `pool.keypoint_proj`, `out` -> `out.0`; LeRobot's stored keypoint grid (`pool.pos_grid`)
  is checked against this project's and dropped.

What cannot be mapped is refused with one line naming the field: another policy type or vision backbone,
image resizing, a separate encoder per camera with several cameras, quantile normalization, processor steps other than
renaming (empty), batching, device and (un)normalization, and unknown config fields.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
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
from lerobot.constants import VISUAL
from lerobot.errors import PretrainedError

LEROBOT_TYPE = "diffusion"
SOURCE = "lerobot-0.6"

# Fields with the same name and meaning in both configs.
_COPIED = (
    "n_obs_steps",
    "horizon",
    "n_action_steps",
    "vision_backbone",
    "crop_shape",
    "crop_is_random",
    "use_group_norm",
    "spatial_softmax_num_keypoints",
    "down_dims",
    "kernel_size",
    "n_groups",
    "diffusion_step_embed_dim",
    "use_film_scale_modulation",
    "noise_scheduler_type",
    "num_train_timesteps",
    "beta_schedule",
    "beta_start",
    "beta_end",
    "prediction_type",
    "clip_sample",
    "clip_sample_range",
    "num_inference_steps",
    "do_mask_loss_for_padding",
    "optimizer_lr",
    "optimizer_betas",
    "optimizer_eps",
    "optimizer_weight_decay",
    "scheduler_name",
    "scheduler_warmup_steps",
)
# Fields read by the conversion itself (checked, translated or dropped on purpose).
_HANDLED = (
    "type",
    "input_features",
    "output_features",
    "normalization_mapping",
    "resize_shape",
    "crop_ratio",
    "pretrained_backbone_weights",
    "use_separate_rgb_encoder_per_camera",
    "use_peft",
)
# Training-only settings (besides LeRobot's runtime fields, which every importer ignores) that do not change
# what the loaded model computes.
_IGNORED = (
    "drop_n_last_frames",
    "gradient_checkpointing",
    "compile_model",
    "compile_mode",
)

# LeRobot module names -> this project's, applied in order to every weight name.
_RENAMES = (
    (r"^diffusion\.", ""),
    (r"\._orig_mod\.", "."),  # the wrapper of a torch.compile'd U-Net (compile_model=true)
    (r"^unet\.diffusion_step_encoder\.", "unet.step_encoder."),
    (r"^unet\.down_modules\.", "unet.down."),
    (r"^unet\.mid_modules\.", "unet.mid."),
    (r"^unet\.up_modules\.", "unet.up."),
    (r"^unet\.final_conv\.0\.block\.", "unet.final.0."),
    (r"^unet\.final_conv\.1\.", "unet.final.1."),
    (r"\.conv([12])\.block\.", r".conv\1."),
    (r"\.cond_encoder\.", ".film."),
    (r"\.residual_conv\.", ".skip."),
    (r"^rgb_encoder\.0\.", "rgb_encoder."),  # a per-camera encoder list holding one camera's encoder
    (r"^rgb_encoder\.pool\.nets\.", "rgb_encoder.pool.keypoint_proj."),
    (r"^rgb_encoder\.out\.", "rgb_encoder.out.0."),
)
_POS_GRID = "rgb_encoder.pool.pos_grid"
_FILM_WEIGHT = re.compile(r"\.film\.1\.weight$")


def _check_images(config: dict[str, Any], features: dict[str, FeatureConfig], where: Path) -> None:
    images = [key for key, f in features.items() if f.kind == VISUAL]
    if not images:
        return
    if not str(config.get("vision_backbone", "")).startswith("resnet"):
        raise refuse(where, "vision_backbone", config.get("vision_backbone"), "only torchvision ResNets map")
    if config.get("resize_shape") is not None:
        raise refuse(where, "resize_shape", config["resize_shape"], "images are not resized here; use null")
    if config.get("use_separate_rgb_encoder_per_camera") and len(images) > 1:
        raise refuse(
            where,
            "use_separate_rgb_encoder_per_camera",
            True,
            f"{len(images)} cameras share one encoder here; only one camera maps",
        )
    crop = config.get("crop_shape")
    if crop is not None:
        _, height, width = features[images[0]].shape
        # torchvision's CenterCrop rounds the offset half to even; this project floors it.
        for size, cropped in ((height, crop[0]), (width, crop[1])):
            if round((size - cropped) / 2.0) != (size - cropped) // 2:
                raise refuse(where, "crop_shape", crop, "its center crop offset rounds differently here")


def convert_config(config: dict[str, Any], where: Path) -> tuple[dict[str, Any], dict[str, FeatureConfig]]:
    """LeRobot's Diffusion `config.json` content -> (this project's `policy` section, the features).

    Raises `PretrainedError` naming the first field that cannot be mapped.
    """
    features = read_config_features(config, (*_HANDLED, *_IGNORED), _COPIED, where)
    _check_images(config, features, where)
    # LeRobot samples with the scheduler it trains with.
    scheduler = config["noise_scheduler_type"]
    section = policy_section("diffusion", config, _COPIED, features, where, inference_scheduler=scheduler)
    return section, features


# ------------------------------------------------------------------------------------------------ weights
def rename(name: str) -> str:
    """A LeRobot Diffusion weight name -> this project's."""
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def convert_state_dict(
    lerobot_state: dict[str, torch.Tensor],
    own: dict[str, torch.Tensor],
    grid: torch.Tensor | None,
    where: Path,
) -> dict[str, torch.Tensor]:
    """LeRobot's weights renamed and reshaped onto the keys and shapes of `own` (this policy's state dict);
    `grid` is this policy's spatial softmax grid `(H*W, 2)` (not in its state dict), None without images."""
    out = {}
    for name, value in lerobot_state.items():
        new = rename(name)
        if new == _POS_GRID:
            if grid is None or grid.shape != value.shape or not torch.allclose(grid, value):
                raise PretrainedError(f"{where}: {name} differs from this project's spatial softmax grid")
            continue
        target = own.get(new)
        if target is not None and value.ndim == 3 and target.ndim == 2 and value.numel() == target.numel():
            value = value.reshape(target.shape)  # Conv1d (C_out, C_in, k) -> TemporalConv1d (C_out, C_in*k)
        out[new] = value
    return out


def conditioning_order(policy: nn.Module) -> torch.Tensor | None:
    """For each input column of this policy's FiLM layers, the LeRobot column it takes (`(E + S*F,)` with E
    the step embedding size, S observation steps, F features per step); None when both orders agree
    (images and an environment state not both present)."""
    if not (policy.image_keys and policy.env_state_key):
        return None
    config = policy.config
    state = config.state_feature[1]
    env_state = config.env_state_feature[1]
    images = len(policy.image_keys) * policy.rgb_encoder.feature_dim
    # Per step, this project's [state, env_state, images] taken from LeRobot's [state, images, env_state].
    per_step = torch.cat(
        [
            torch.arange(state),
            torch.arange(state + images, state + images + env_state),
            torch.arange(state, state + images),
        ]
    )
    width = per_step.numel()
    steps = [per_step + s * width for s in range(config.n_obs_steps)]
    embed = config.diffusion_step_embed_dim
    return torch.cat([torch.arange(embed), *(columns + embed for columns in steps)])


def read_spec(directory: Path, config: dict[str, Any]) -> PretrainedSpec:
    """The spec of a LeRobot diffusion `pretrained_model` directory, from its `config.json` content `config`."""
    return lerobot_spec(directory, config, convert_config, SOURCE)


def load_weights(spec: PretrainedSpec, policy_cfg: PolicyConfig) -> nn.Module:
    """This project's policy of `policy_cfg` (converted from the LeRobot config of `spec`) with the LeRobot
    weights, renamed and reshaped (`convert_weights`), and normalization statistics of its directory."""
    return load_lerobot_policy(spec, policy_cfg, "diffusion", "diffusion", convert_weights)


def convert_weights(
    lerobot_state: dict[str, torch.Tensor], policy: nn.Module, where: Path
) -> dict[str, torch.Tensor]:
    """LeRobot's weights (read from `where`) on this `policy`'s names and shapes (`convert_state_dict`), the
    input columns of its FiLM layers in this project's conditioning order (`conditioning_order`)."""
    grid = policy.rgb_encoder.pool.grid if policy.image_keys else None
    state = convert_state_dict(lerobot_state, policy.state_dict(), grid, where)
    order = conditioning_order(policy)
    if order is not None:
        for name in [k for k in state if _FILM_WEIGHT.search(k)]:
            if state[name].shape[-1] == order.numel():  # a wrong width is reported by the load below
                state[name] = state[name][:, order]
    return state
