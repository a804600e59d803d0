"""Diffusion Policy (Chi et al. 2023): actions as the denoising of a noise sequence, conditioned on observations.

Training (`forward`): add noise at a random diffusion step to the normalized action sequence of the
dataset sample and regress the noise (epsilon prediction) with the 1-D U-Net, conditioned on the features of
the last `n_obs_steps` observations. The random numbers of a sample (its crop offsets, noise and diffusion
step) are `draw_training_noise`'s; `forward` takes them from the batch when the trainer put them there and
draws them itself otherwise. Its loss is the plain (masked) mean over its batch, and it reports what it
averaged over (`LOSS_COUNT`).

Inference (`predict_action_chunk`): start from Gaussian noise `(B, horizon, A)` and denoise it step by step
(DDPM, or DDIM with fewer steps) under the same conditioning; unnormalize. The sampler calls the U-Net
through `condition` (once per chunk) and `denoise` (once per step).

Alignment of the action horizon with the observation history (n_obs_steps = 2, horizon = 16, at step t):

    observations:      o[t-1]  o[t]
    horizon indices:   0       1      2     ...   15
    env steps:         t-1     t      t+1   ...   t+14

The horizon starts at the first observation step (the dataset's `delta_timestamps` gives the actions at
offsets -(n_obs_steps-1)/fps .. (horizon-n_obs_steps)/fps), so `predict_action_chunk` drops the first
`n_obs_steps - 1` actions (already in the past) and returns `horizon - n_obs_steps + 1` actions whose index
0 is "now"; the `Policy` base class executes the first `n_action_steps` of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import einops
import torch
from diffusers import DDIMScheduler, DDPMScheduler
from diffusers.utils.torch_utils import randn_tensor
from torch import Tensor, nn

from lerobot.constants import ACTION_IS_PAD, LOSS_COUNT, TRAINING_NOISE_PREFIX
from lerobot.normalize import Normalize, Unnormalize
from lerobot.policies.diffusion.configuration import DiffusionConfig
from lerobot.policies.diffusion.unet import ConditionalUnet1D
from lerobot.policies.diffusion.vision import RgbEncoder
from lerobot.policies.policy import Policy, acting_settings

_SCHEDULERS = {"DDPM": DDPMScheduler, "DDIM": DDIMScheduler}

# The per-sample draws of a training batch (`DiffusionPolicy.draw_training_noise`).
CROP_OFFSETS = TRAINING_NOISE_PREFIX + "crop_offsets"  # (B, n_obs_steps, N_cam, 2) int64: (top, left)
ACTION_NOISE = TRAINING_NOISE_PREFIX + "action"  # (B, horizon, A) float32
TIMESTEPS = TRAINING_NOISE_PREFIX + "timesteps"  # (B,) int64 in [0, num_train_timesteps)


def make_noise_scheduler(config: DiffusionConfig, name: str) -> DDPMScheduler | DDIMScheduler:
    """A diffusers scheduler (`"DDPM"` or `"DDIM"`) with the config's noise schedule.

    Its tables live on the CPU whatever the default device (it may be built lazily, at the first chunk):
    diffusers reads them as scalars at each step, and moves them itself where it needs them elsewhere.
    """
    with torch.device("cpu"):
        return _SCHEDULERS[name](
            num_train_timesteps=config.num_train_timesteps,
            beta_start=config.beta_start,
            beta_end=config.beta_end,
            beta_schedule=config.beta_schedule,
            clip_sample=config.clip_sample,
            clip_sample_range=config.clip_sample_range,
            prediction_type=config.prediction_type,
        )


def edge_pad_actions(actions: Tensor, is_pad: Tensor) -> Tensor:
    """Replace padded actions `(B, T, A)` (where `is_pad` (B, T) is True) by the nearest real action.

    Later pads take the last real action before them, leading pads the first real one: what the paper's
    sampler stores there. Doing it here makes the loss independent of whatever a dataset wrote into padded
    slots, which otherwise would leak into real positions through the U-Net's convolutions.
    """
    horizon = actions.shape[1]
    positions = torch.arange(horizon, device=actions.device).expand_as(is_pad)
    last_real = torch.where(is_pad, -1, positions).cummax(dim=1).values  # (B, T), -1 before the first real
    first_real = (~is_pad).to(torch.uint8).argmax(dim=1, keepdim=True)  # (B, 1)
    source = torch.where(last_real < 0, first_real, last_real)
    return torch.gather(actions, 1, einops.repeat(source, "b t -> b t a", a=actions.shape[-1]))


class DiffusionPolicy(Policy):
    """Diffusion Policy with a conditional 1-D U-Net, for image or low-dimensional (keypoint) observations.

    Args:
        config: a `DiffusionConfig` whose `input_features` / `output_features` are filled; `resolve_defaults()` and
            `validate()` are called here (idempotent), for a config not made by `make_policy_config`.
        dataset_stats: `{key: {"mean","std","min","max": Tensor}}` for the normalized features; None when the
            statistics come from a checkpoint loaded next (`load_state_dict`).

    Attributes:
        generator: optional `torch.Generator` for the inference noise, used when `predict_action_chunk` gets
            none (so `select_action` through the base class is reproducible too).
    """

    def __init__(
        self, config: DiffusionConfig, dataset_stats: Mapping[str, Mapping[str, Tensor]] | None = None
    ):
        config.resolve_defaults()  # a config made directly, not by make_policy_config, may still hold None
        config.validate()
        super().__init__(**acting_settings(config))
        self.config = config
        self.generator: torch.Generator | None = None

        self.normalize_inputs = Normalize(config.input_features, config.normalization_mapping, dataset_stats)
        self.normalize_targets = Normalize(
            config.output_features, config.normalization_mapping, dataset_stats
        )
        self.unnormalize_outputs = Unnormalize(
            config.output_features, config.normalization_mapping, dataset_stats
        )

        self.image_keys = sorted(config.image_features)
        self.state_key, state_dim = config.state_feature
        env_state = config.env_state_feature
        self.env_state_key = env_state[0] if env_state else None
        per_step_dim = state_dim + (env_state[1] if env_state else 0)
        if self.image_keys:
            self.rgb_encoder = RgbEncoder(config)
            per_step_dim += len(self.image_keys) * self.rgb_encoder.feature_dim
        self.action_key = config.action_key
        global_cond_dim = per_step_dim * config.n_obs_steps
        task = config.task_feature
        self.task_key = task[0] if task else None
        if task is not None:  # one policy for several tasks: which one it runs joins the conditioning
            self.task_embedding = nn.Embedding(task[1], config.task_embedding_dim)
            global_cond_dim += config.task_embedding_dim

        self.unet = ConditionalUnet1D(
            action_dim=config.action_dim,
            global_cond_dim=global_cond_dim,
            down_dims=config.down_dims,
            kernel_size=config.kernel_size,
            n_groups=config.n_groups,
            step_embed_dim=config.diffusion_step_embed_dim,
            use_film_scale=config.use_film_scale_modulation,
        )
        self.noise_scheduler = make_noise_scheduler(config, config.noise_scheduler_type)
        self._inference_schedulers: dict[str, DDPMScheduler | DDIMScheduler] = {}

    # ------------------------------------------------------------------ conditioning
    def _check_obs(self, batch: Mapping[str, Tensor]) -> None:
        keys = [*self.image_keys, self.state_key]
        keys += [key for key in (self.env_state_key, self.task_key) if key is not None]
        for key in keys:
            if key not in batch:
                raise KeyError(f"diffusion policy needs {key!r} in the batch, got {sorted(batch)}")
            if batch[key].ndim < 2 or batch[key].shape[1] != self.n_obs_steps:
                raise ValueError(
                    f"{key!r} must be (B, n_obs_steps={self.n_obs_steps}, ...), got {tuple(batch[key].shape)}"
                )

    def global_conditioning(
        self, batch: Mapping[str, Tensor], image_encoder: Callable[[Tensor], Tensor] | None = None
    ) -> Tensor:
        """Normalized observations `(B, n_obs_steps, ...)` -> flattened features `(B, n_obs_steps * F)`.

        Per step: `[state, env_state?, camera features...]`; images of all steps and cameras go through the
        encoder (`image_encoder`, default `self.rgb_encoder`) as one batch. A multi-task policy appends its
        task's embedding `(B, task_embedding_dim)` once (the newest step's task id; an episode keeps one task).
        """
        parts = [batch[self.state_key]]  # (B, S, D_state)
        if self.env_state_key is not None:
            parts.append(batch[self.env_state_key])
        if self.image_keys:
            images = torch.stack([batch[k] for k in self.image_keys], dim=2)  # (B, S, N_cam, C, H, W)
            batch_size, steps = images.shape[:2]
            flat = einops.rearrange(images, "b s n c h w -> (b s n) c h w")
            features = (image_encoder or self.rgb_encoder)(flat)  # (B*S*N_cam, F)
            parts.append(einops.rearrange(features, "(b s n) f -> b s (n f)", b=batch_size, s=steps))
        per_step = torch.cat([p.float() for p in parts], dim=-1)  # (B, S, F)
        cond = einops.rearrange(per_step, "b s f -> b (s f)")
        if self.task_key is None:
            return cond
        task_ids = batch[self.task_key][:, -1].round().long()  # (B,)
        return torch.cat([cond, self.task_embedding(task_ids).float()], dim=-1)

    # ------------------------------------------------------------------ training
    def draw_training_noise(self, n: int) -> dict[str, Tensor]:
        """The random numbers of a training `forward` on `n` samples, one row per sample, in the order
        `forward` uses them: the random crops' offsets of every image (`CROP_OFFSETS`, when the encoder
        crops randomly in its current mode), then the noise (`ACTION_NOISE`), then the diffusion steps
        (`TIMESTEPS`).

        All come from the CPU stream (a few KB), whatever device or GPU count trains, so a checkpoint's CPU
        random state resumes them exactly; `forward` copies them to the device without waiting for it.
        """
        draws = {}
        if self.image_keys:
            n_images = self.n_obs_steps * len(self.image_keys)
            offsets = self.rgb_encoder.draw_crop_offsets(n * n_images)  # ((n s c), 2), as the images flatten
            if offsets is not None:
                draws[CROP_OFFSETS] = offsets.view(n, self.n_obs_steps, len(self.image_keys), 2)
        draws[ACTION_NOISE] = torch.randn((n, self.config.horizon, self.config.action_dim), device="cpu")
        draws[TIMESTEPS] = torch.randint(0, self.config.num_train_timesteps, (n,), device="cpu")
        return draws

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Denoising loss of one dataset batch.

        Args:
            batch: observations `(B, n_obs_steps, ...)`, `action` `(B, horizon, A)` and optionally
                `action_is_pad` `(B, horizon)` (True past the episode's end). The per-sample random draws
                (`draw_training_noise`) are read from its `TRAINING_NOISE_PREFIX` entries when it has any,
                and drawn here otherwise.

        Returns:
            `{"loss": scalar, LOSS_COUNT: scalar}`: the MSE between the U-Net's prediction and its target
            (the noise for epsilon prediction, the clean actions for sample prediction), averaged over the
            real (unpadded) action values of the batch when `do_mask_loss_for_padding`, over all of them
            otherwise; `LOSS_COUNT` is the number of values it averaged over (not differentiable).
        """
        self._check_obs(batch)
        actions = batch[self.action_key]
        if actions.ndim != 3 or actions.shape[1] != self.config.horizon:
            raise ValueError(
                f"{self.action_key!r} must be (B, horizon={self.config.horizon}, A), got {tuple(actions.shape)}"
            )
        is_pad = batch.get(ACTION_IS_PAD)
        batch = self.normalize_targets(self.normalize_inputs(batch))
        actions = batch[self.action_key]
        if is_pad is not None:
            actions = edge_pad_actions(actions, is_pad)

        # The draws the trainer made for this batch, or this batch's own (on one process the same).
        draws = {k: v for k, v in batch.items() if k.startswith(TRAINING_NOISE_PREFIX)}
        draws = draws or self.draw_training_noise(actions.shape[0])
        encoder = None
        if CROP_OFFSETS in draws:
            offsets = einops.rearrange(draws[CROP_OFFSETS], "b s n xy -> (b s n) xy")  # as the images flatten
            encoder = functools.partial(self.rgb_encoder, crop_offsets=offsets)
        global_cond = self.global_conditioning(batch, encoder)
        # The copies to the device do not wait for it.
        noise = draws[ACTION_NOISE].to(actions.device, actions.dtype, non_blocking=True)
        steps = draws[TIMESTEPS].to(actions.device, non_blocking=True)
        noisy = self.noise_scheduler.add_noise(actions, noise, steps)
        prediction = self.unet(noisy, steps, global_cond)
        target = noise if self.config.prediction_type == "epsilon" else actions
        error = nn.functional.mse_loss(prediction.float(), target, reduction="none")  # (B, T, A)

        if self.config.do_mask_loss_for_padding and is_pad is not None:
            real = einops.rearrange(~is_pad, "b t -> b t 1").to(error.dtype)
            count = real.sum() * error.shape[-1]  # real action values
            loss = (error * real).sum() / count.clamp_min(1.0)
        else:
            count = error.new_full((), error.numel())
            loss = error.mean()
        return {"loss": loss, LOSS_COUNT: count}

    # ------------------------------------------------------------------ inference
    @property
    def inference_noise_scheduler(self) -> DDPMScheduler | DDIMScheduler:
        """The scheduler named by `config.inference_scheduler`, read at every call so that evaluation can
        switch (e.g. `policy.config.inference_scheduler = "DDIM"; policy.config.num_inference_steps = 10`)."""
        name = self.config.inference_scheduler
        if name not in self._inference_schedulers:
            self._inference_schedulers[name] = make_noise_scheduler(self.config, name)
        return self._inference_schedulers[name]

    @torch.no_grad()
    def sample_actions(
        self, global_cond: Tensor, generator: torch.Generator | list[torch.Generator] | None = None
    ) -> Tensor:
        """Denoise Gaussian noise into normalized actions `(B, horizon, A)` given `global_cond` `(B, G)`.

        Uses `config.inference_scheduler` with `config.num_inference_steps` (None: num_train_timesteps) and
        the U-Net's `condition` / `denoise`. The noise, the sample and the scheduler's arithmetic are fp32
        whatever the U-Net computes in, so the same generator gives the same noise. `generator` may be a
        list of B generators, one per row: row b's initial and DDPM noise then come from generator b alone."""
        scheduler = self.inference_noise_scheduler
        num_steps = self.config.num_inference_steps or self.config.num_train_timesteps
        device = global_cond.device
        # Drawn on the generators' device (a CPU generator can seed a CUDA run), then moved.
        shape = (global_cond.shape[0], self.config.horizon, self.config.action_dim)
        sample = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        scheduler.set_timesteps(num_steps)
        timesteps = scheduler.timesteps  # a CPU tensor: reading a step costs no device sync
        conditioning = self.unet.condition(global_cond, timesteps)
        for i, step in enumerate(timesteps):
            prediction = self.unet.denoise(sample, conditioning, i).float()
            # The sampler's arithmetic (and the sample it accumulates) stays fp32 under any autocast. The
            # scheduler's bookkeeping tensors (some created without a device) stay on the host with its
            # tables, whatever the default device.
            with torch.autocast(device_type=device.type, enabled=False), torch.device("cpu"):
                sample = scheduler.step(prediction, step, sample, generator=generator).prev_sample
        return sample

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, Tensor], generator: torch.Generator | list[torch.Generator] | None = None
    ) -> Tensor:
        """Actions from the current step on, `(B, horizon - n_obs_steps + 1, A)`, in the data's units.

        Args:
            batch: observations `(B, n_obs_steps, ...)` (oldest first, the last one is "now").
            generator: seeds the initial noise and the DDPM noise; defaults to `self.generator`, then to
                the rows' episode streams (`noise_generators`, during `select_action`), then to the
                global stream.

        The denoised horizon starts at the first observation step; index `n_obs_steps - 1` is the current
        step and is returned as index 0 (see the module docstring).
        """
        self._check_obs(batch)
        if generator is None:
            generator = self.generator if self.generator is not None else self.noise_generators()
        batch = self.normalize_inputs(batch)
        global_cond = self.global_conditioning(batch)
        actions = self.sample_actions(global_cond.float(), generator)
        actions = self.unnormalize_outputs({self.action_key: actions})[self.action_key]
        return actions[:, self.n_obs_steps - 1 :]
