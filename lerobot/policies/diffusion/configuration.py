"""`DiffusionConfig`: Diffusion Policy (Chi et al. 2023, CNN U-Net variant) settings.

Defaults follow the paper's PushT setup: 2 observation steps, a 16-step action horizon of which 8 are
executed, a ResNet-18 with GroupNorm and a spatial softmax for images, a 1-D temporal U-Net conditioned
through FiLM, 100 DDPM steps with the `squaredcos_cap_v2` schedule and epsilon prediction.

Fields left `None` are resolved by `resolve_defaults()` from the input features:

| field        | with an image input | low-dimensional (keypoints) |
|--------------|---------------------|-----------------------------|
| `down_dims`  | [512, 1024, 2048]   | [256, 512, 1024]            |
| `batch_size` | 64                  | 256                         |
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.config import OFFLINE, PolicyConfig
from lerobot.constants import ACTION_KIND, ENV_STATE, STATE, VISUAL
from lerobot.errors import ConfigError
from lerobot.normalize import MEAN_STD, MIN_MAX, NORMALIZATION_MODES

SCHEDULERS = ("DDPM", "DDIM")


def _default_normalization() -> dict[str, str]:
    return {VISUAL: MEAN_STD, STATE: MIN_MAX, ENV_STATE: MIN_MAX, ACTION_KIND: MIN_MAX}


@dataclass
class DiffusionConfig(PolicyConfig):
    """Diffusion Policy configuration; see the module docstring for the modality-dependent defaults."""

    name: str = "diffusion"
    training_mode: str = OFFLINE

    # Timing. The action horizon starts at the first observation step, so a chunk predicted at env step t
    # covers t - n_obs_steps + 1 .. t - n_obs_steps + horizon; `predict_action_chunk` drops the past part.
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8

    # Feature kind -> "mean_std" | "min_max" | "identity"; min-max maps to [-1, 1].
    normalization_mapping: dict[str, str] = field(default_factory=_default_normalization)

    # Vision encoder (used when a `visual` input feature exists; all cameras share it).
    vision_backbone: str = "resnet18"  # any torchvision ResNet constructor name
    # Residual stages of the ResNet kept (1-4; the paper keeps all 4). Each stage halves the feature map: on
    # small crops fewer stages leave the spatial softmax a finer map (44x44 crops: 2x2 after 4 stages, 3x3
    # after 3) and drop the widest stage's weights (8.4M of ResNet-18's 11.2M).
    vision_backbone_stages: int = 4
    # torchvision weights name, e.g. "ResNet18_Weights.IMAGENET1K_V1"; None trains from scratch (no download).
    pretrained_backbone_weights: str | None = None
    # Replace BatchNorm by GroupNorm (the paper's choice when training from scratch).
    use_group_norm: bool = True
    spatial_softmax_num_keypoints: int = 32
    # Resize images to [height, width] before cropping (bilinear, antialiased); None keeps their size. A
    # smaller input makes the encoder cheaper: the CPU image experiment halves each side.
    resize_shape: list[int] | None = None
    # Random crop in training, center crop at evaluation; None disables cropping.
    crop_shape: list[int] | None = field(default_factory=lambda: [84, 84])
    crop_is_random: bool = True

    # 1-D temporal U-Net. `down_dims` None: resolved by modality (see module docstring).
    down_dims: list[int] | None = None
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 128
    use_film_scale_modulation: bool = True
    # Multi-task envs (an input of kind `task`, e.g. MetaWorld's `observation.task_index`): the task id's
    # learned embedding joins the U-Net's global conditioning. Unused by a single-task env.
    task_embedding_dim: int = 32

    # Noise schedule (training). DDPM and DDIM share it; the name only picks the scheduler class.
    noise_scheduler_type: str = "DDPM"
    num_train_timesteps: int = 100
    beta_schedule: str = "squaredcos_cap_v2"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    prediction_type: str = "epsilon"  # "epsilon" (predict the noise) or "sample" (predict the actions)
    clip_sample: bool = True
    clip_sample_range: float = 1.0

    # Inference: "DDPM" or "DDIM" (deterministic, eta=0) with `num_inference_steps` (None = num_train_timesteps).
    inference_scheduler: str = "DDPM"
    num_inference_steps: int | None = None

    # Loss: ignore the U-Net's error on padded actions (past the episode's end).
    do_mask_loss_for_padding: bool = True

    # Training defaults from the paper. batch_size None: 64 with images, 256 low-dimensional.
    batch_size: int | None = None
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = (0.95, 0.999)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 1e-6
    scheduler_name: str = "cosine"
    scheduler_warmup_steps: int = 500
    use_ema: bool = True
    ema_power: float = 0.75
    ema_max_decay: float = 0.9999

    # ------------------------------------------------------------------ validation
    @property
    def default_down_dims(self) -> list[int]:
        """The U-Net widths of this modality (see the module docstring)."""
        return [512, 1024, 2048] if self.image_features else [256, 512, 1024]

    def resolve_defaults(self) -> None:
        """`down_dims` and `batch_size` left `None`: the modality's defaults (see the module docstring)."""
        if self.down_dims is None:
            self.down_dims = self.default_down_dims
        if self.batch_size is None:
            self.batch_size = 64 if self.image_features else 256

    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent settings; fields still `None` stand for their modality's default,
        which `resolve_defaults` fills in."""
        has_images = bool(self.image_features)
        super().validate()

        if len(self.output_features) != 1:
            raise ConfigError(
                f"diffusion policy needs exactly one action feature, got {list(self.output_features)}"
            )
        (action,) = self.output_features.values()
        if len(action.shape) != 1:
            raise ConfigError(f"the action feature must be a vector, got shape {action.shape}")
        if self.state_feature is None:
            raise ConfigError("diffusion policy needs an 'observation.state'-like input of kind 'state'")
        if not has_images and self.env_state_feature is None:
            raise ConfigError(
                "diffusion policy needs a visual input or an env_state input (e.g. keypoints) besides the state; "
                f"got inputs {list(self.input_features)}"
            )
        self._validate_images()

        if self.horizon < self.n_action_steps + self.n_obs_steps - 1:
            raise ConfigError(
                f"policy.horizon={self.horizon} must be >= n_action_steps + n_obs_steps - 1 = "
                f"{self.n_action_steps + self.n_obs_steps - 1}: the chunk starts at the first observation "
                "step and must still hold n_action_steps actions from the current step on"
            )
        dims = self.down_dims if self.down_dims is not None else self.default_down_dims
        if not dims or any(d < 1 for d in dims):
            raise ConfigError(f"policy.down_dims={self.down_dims} must be a non-empty list of positive ints")
        # The U-Net halves the time axis after every level but the last.
        factor = 2 ** (len(dims) - 1)
        if self.horizon % factor:
            raise ConfigError(
                f"policy.horizon={self.horizon} must be divisible by 2**(len(down_dims)-1)={factor} "
                f"(the U-Net downsamples the time axis {len(dims) - 1} times)"
            )
        for dim in dims:
            if dim % self.n_groups:
                raise ConfigError(
                    f"policy.n_groups={self.n_groups} must divide every U-Net width "
                    f"(down_dims={dims}) for GroupNorm"
                )
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"policy.kernel_size={self.kernel_size} must be odd (same-length convolutions)")
        if self.task_embedding_dim < 1:
            raise ConfigError(f"policy.task_embedding_dim={self.task_embedding_dim} must be >= 1")
        if self.diffusion_step_embed_dim % 2:
            raise ConfigError(f"policy.diffusion_step_embed_dim={self.diffusion_step_embed_dim} must be even")

        for key, value, allowed in (
            ("noise_scheduler_type", self.noise_scheduler_type, SCHEDULERS),
            ("inference_scheduler", self.inference_scheduler, SCHEDULERS),
            ("prediction_type", self.prediction_type, ("epsilon", "sample")),
            ("beta_schedule", self.beta_schedule, ("linear", "scaled_linear", "squaredcos_cap_v2")),
        ):
            if value not in allowed:
                raise ConfigError(f"policy.{key}={value!r}: expected one of {allowed}")
        if self.num_train_timesteps < 1:
            raise ConfigError(f"policy.num_train_timesteps={self.num_train_timesteps} must be >= 1")
        if (
            self.num_inference_steps is not None
            and not 1 <= self.num_inference_steps <= self.num_train_timesteps
        ):
            raise ConfigError(
                f"policy.num_inference_steps={self.num_inference_steps} must be in [1, num_train_timesteps="
                f"{self.num_train_timesteps}] (or null for num_train_timesteps)"
            )
        for kind, mode in self.normalization_mapping.items():
            if mode not in NORMALIZATION_MODES:
                raise ConfigError(
                    f"policy.normalization_mapping.{kind}={mode!r}: expected one of {NORMALIZATION_MODES}"
                )

    def _validate_images(self) -> None:
        images = self.image_features
        if not images:
            return
        shapes = {tuple(s) for s in images.values()}
        if len(shapes) > 1:
            raise ConfigError(f"all cameras share one encoder and must have the same shape, got {images}")
        for key, shape in images.items():
            if len(shape) != 3:
                raise ConfigError(f"visual input {key!r} must be (C, H, W), got {shape}")
        (shape,) = shapes
        size, what = tuple(shape[1:]), "the image (H, W)"
        if self.resize_shape is not None:
            if len(self.resize_shape) != 2 or min(self.resize_shape) < 1:
                raise ConfigError(
                    f"policy.resize_shape={self.resize_shape} must be [height, width] (positive) or null"
                )
            size, what = tuple(self.resize_shape), "policy.resize_shape"
        if self.crop_shape is not None:
            if len(self.crop_shape) != 2:
                raise ConfigError(f"policy.crop_shape={self.crop_shape} must be [height, width] or null")
            if self.crop_shape[0] > size[0] or self.crop_shape[1] > size[1]:
                raise ConfigError(f"policy.crop_shape={self.crop_shape} does not fit in {what}={size}")
        if self.pretrained_backbone_weights is not None and self.use_group_norm:
            raise ConfigError(
                "policy.use_group_norm=true would discard the pretrained BatchNorm statistics of "
                f"{self.pretrained_backbone_weights!r}; set use_group_norm=false with pretrained weights"
            )
        if not 1 <= self.vision_backbone_stages <= 4:
            raise ConfigError(
                f"policy.vision_backbone_stages={self.vision_backbone_stages} must be 1, 2, 3 or 4 (a ResNet "
                "has four residual stages)"
            )
        if self.spatial_softmax_num_keypoints < 1:
            raise ConfigError(
                f"policy.spatial_softmax_num_keypoints={self.spatial_softmax_num_keypoints} must be >= 1"
            )

    # ------------------------------------------------------------------ dataset windows
    def delta_timestamps(self, fps: int) -> dict[str, list[float]]:
        """Frame offsets (seconds) of one training sample, per feature.

        Observations: the last `n_obs_steps` frames up to now, `[-(n_obs_steps-1)/fps, ..., 0]`.
        Actions: `horizon` frames starting at the first observation frame,
        `[-(n_obs_steps-1)/fps, ..., (horizon-n_obs_steps)/fps]` (at 10 fps: -0.1 .. 1.4).
        """
        obs = [i / fps for i in range(1 - self.n_obs_steps, 1)]
        actions = [i / fps for i in range(1 - self.n_obs_steps, self.horizon - self.n_obs_steps + 1)]
        out = {key: list(obs) for key in self.input_features}
        out[self.action_key] = actions
        return out
