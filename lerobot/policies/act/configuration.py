"""`ACTConfig`: Action Chunking Transformer (Zhao et al. 2023) settings.

Defaults are LeRobot's `ACTConfig` (themselves the paper's ALOHA settings): one observation step, chunks of
100 actions all executed, a 512-wide transformer (4 encoder layers, 1 decoder layer, 8 heads, feed-forward
3200, post-norm, dropout 0.1), a 32-d latent from a 4-layer VAE encoder with KL weight 10, a ResNet-18 trunk
with frozen BatchNorm, AdamW at 1e-5 (the backbone too) with weight decay 1e-4, batch 8, a constant learning
rate and mean/std normalization. Two differences with LeRobot:

- `pretrained_backbone_weights` defaults to None (LeRobot: ImageNet weights), since nothing can be
  downloaded here; name torchvision weights (e.g. "ResNet18_Weights.IMAGENET1K_V1") that are in the local
  torch cache to use them.
- every feature kind is normalized by mean/std; LeRobot's mapping has no entry for the environment state,
  which it leaves unnormalized.

See docs/act.md for where these defaults, and LeRobot, depart from the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.config import OFFLINE, PolicyConfig
from lerobot.constants import ACTION_KIND, ENV_STATE, STATE, VISUAL
from lerobot.errors import ConfigError
from lerobot.normalize import MEAN_STD, NORMALIZATION_MODES

ACTIVATIONS = ("relu", "gelu")


def _default_normalization() -> dict[str, str]:
    return {VISUAL: MEAN_STD, STATE: MEAN_STD, ENV_STATE: MEAN_STD, ACTION_KIND: MEAN_STD}


@dataclass
class ACTConfig(PolicyConfig):
    """ACT configuration; inputs are picked by kind: cameras (`visual`), an optional robot `state` and an
    optional `env_state` (e.g. keypoints), at least one camera or the env state."""

    name: str = "act"
    training_mode: str = OFFLINE

    # Timing: one observation in, `chunk_size` actions out, the first `n_action_steps` of them executed
    # (or, with `temporal_ensemble_coeff` and n_action_steps=1, a chunk at every step, ensembled).
    n_obs_steps: int = 1
    chunk_size: int = 100
    n_action_steps: int = 100

    # Feature kind -> "mean_std" | "min_max" | "identity".
    normalization_mapping: dict[str, str] = field(default_factory=_default_normalization)

    # Vision trunk (used when a `visual` input exists; all cameras share it): a torchvision ResNet up to its
    # last stage, BatchNorm frozen.
    vision_backbone: str = "resnet18"
    # torchvision weights name, e.g. "ResNet18_Weights.IMAGENET1K_V1" (read from the local torch cache);
    # None trains the trunk from scratch.
    pretrained_backbone_weights: str | None = None
    # Dilate the last stage instead of striding it: a feature map twice as large on each side.
    replace_final_stride_with_dilation: bool = False
    # [height, width] the images are resized to (bilinear, antialiased) before the trunk, or None: the
    # trunk's cost grows with the pixels, so a CPU recipe halves the side (not in LeRobot's ACT).
    resize_shape: list[int] | None = None

    # Transformer.
    pre_norm: bool = False
    dim_model: int = 512
    n_heads: int = 8
    dim_feedforward: int = 3200
    feedforward_activation: str = "relu"
    n_encoder_layers: int = 4
    # The original code has 7 decoder layers but, by a bug, used only the first one's output; LeRobot (and
    # this default) build just that one.
    n_decoder_layers: int = 1

    # CVAE: a transformer encoder over [cls, state, actions] gives the latent's mean and log-variance.
    use_vae: bool = True
    latent_dim: int = 32
    n_vae_encoder_layers: int = 4

    # Training and loss: L1 on the normalized actions + kl_weight * KL(latent || N(0, I)).
    dropout: float = 0.1
    kl_weight: float = 10.0

    # Optimisation (LeRobot's preset): AdamW; the vision trunk has its own learning rate.
    batch_size: int = 8
    optimizer_lr: float = 1e-5
    optimizer_lr_backbone: float = 1e-5
    optimizer_weight_decay: float = 1e-4
    scheduler_name: str = "constant"
    scheduler_warmup_steps: int = 0
    use_ema: bool = False

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent settings (one line naming the field); changes nothing."""
        super().validate()
        if len(self.output_features) != 1:
            raise ConfigError(
                f"act policy needs exactly one action feature, got {list(self.output_features)}"
            )
        (action,) = self.output_features.values()
        if len(action.shape) != 1:
            raise ConfigError(f"the action feature must be a vector, got shape {action.shape}")
        self._single_vector(STATE)  # raises on more than one state input, or a non-vector one
        if not self.image_features and self.env_state_feature is None:
            raise ConfigError(
                "act policy needs a visual input or an env_state input (e.g. keypoints); "
                f"got inputs {list(self.input_features)}"
            )
        if self.n_obs_steps != 1:
            raise ConfigError(f"policy.n_obs_steps={self.n_obs_steps}: act takes one observation step (1)")
        if self.chunk_size < 1:
            raise ConfigError(f"policy.chunk_size={self.chunk_size} must be >= 1")
        if self.n_action_steps > self.chunk_size:
            raise ConfigError(
                f"policy.n_action_steps={self.n_action_steps} must be <= chunk_size={self.chunk_size} "
                "(the actions executed are taken from one chunk)"
            )
        if self.dim_model < 1 or self.n_heads < 1 or self.dim_model % self.n_heads:
            raise ConfigError(
                f"policy.dim_model={self.dim_model} must be a positive multiple of n_heads={self.n_heads}"
            )
        if self.image_features and self.dim_model % 4:
            raise ConfigError(
                f"policy.dim_model={self.dim_model} must be a multiple of 4 with images (the 2-D position "
                "embedding gives each image axis dim_model / 2 interleaved sines and cosines)"
            )
        if self.dim_feedforward < 1:
            raise ConfigError(f"policy.dim_feedforward={self.dim_feedforward} must be >= 1")
        if self.feedforward_activation not in ACTIVATIONS:
            raise ConfigError(
                f"policy.feedforward_activation={self.feedforward_activation!r}: expected one of {ACTIVATIONS}"
            )
        for key in ("n_encoder_layers", "n_decoder_layers", "latent_dim"):
            if getattr(self, key) < 1:
                raise ConfigError(f"policy.{key}={getattr(self, key)} must be >= 1")
        if self.use_vae and self.n_vae_encoder_layers < 1:
            raise ConfigError(
                f"policy.n_vae_encoder_layers={self.n_vae_encoder_layers} must be >= 1 with use_vae=true"
            )
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"policy.dropout={self.dropout} must be in [0, 1)")
        if not self.kl_weight >= 0:
            raise ConfigError(f"policy.kl_weight={self.kl_weight} must be >= 0")
        if not self.optimizer_lr_backbone >= 0:
            raise ConfigError(f"policy.optimizer_lr_backbone={self.optimizer_lr_backbone} must be >= 0")
        if not self.vision_backbone.startswith("resnet"):
            raise ConfigError(
                f"policy.vision_backbone={self.vision_backbone!r}: expected a torchvision ResNet (resnet18, ...)"
            )
        if self.replace_final_stride_with_dilation and self.vision_backbone in ("resnet18", "resnet34"):
            raise ConfigError(
                f"policy.replace_final_stride_with_dilation=true needs a bottleneck ResNet (resnet50 and up); "
                f"{self.vision_backbone}'s basic blocks cannot dilate"
            )
        for kind, mode in self.normalization_mapping.items():
            if mode not in NORMALIZATION_MODES:
                raise ConfigError(
                    f"policy.normalization_mapping.{kind}={mode!r}: expected one of {NORMALIZATION_MODES}"
                )
        self._validate_images()

    def _validate_images(self) -> None:
        images = self.image_features
        for key, shape in images.items():
            if len(shape) != 3:
                raise ConfigError(f"visual input {key!r} must be (C, H, W), got {shape}")
        if len({tuple(s) for s in images.values()}) > 1:
            raise ConfigError(f"all cameras share one trunk and must have the same shape, got {images}")
        if self.resize_shape is not None and (len(self.resize_shape) != 2 or min(self.resize_shape) < 1):
            raise ConfigError(
                f"policy.resize_shape={self.resize_shape} must be [height, width] (positive) or null"
            )

    # ------------------------------------------------------------------ dataset windows
    def delta_timestamps(self, fps: int) -> dict[str, list[float]]:
        """Frame offsets (seconds) of one training sample: every input at 0 (now), the action at
        `[0, 1/fps, ..., (chunk_size - 1)/fps]` (the chunk starts now)."""
        out = {key: [0.0] for key in self.input_features}
        out[self.action_key] = [i / fps for i in range(self.chunk_size)]
        return out
