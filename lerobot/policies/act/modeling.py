"""Action Chunking Transformer (Zhao et al. 2023, "Learning Fine-Grained Bimanual Manipulation with Low-Cost
Hardware"): a conditional VAE whose decoder is a DETR-style transformer predicting a chunk of actions.

Acting (`predict_action_chunk`), from one observation:

    latent z = 0 (the prior's mean)  ─┐
    robot state  ─ linear ────────────┼─> encoder tokens [z, state, env_state, camera pixels...]
    env state    ─ linear ────────────┤      (1-D learned position embeddings for the first ones,
    cameras ─ ResNet (frozen BN) ─ 1x1 conv ─┘     2-D sinusoidal ones for the pixels)
    transformer encoder -> memory; decoder: `chunk_size` zero queries + learned query positions,
    self-attention and cross-attention to the memory -> linear head -> `(B, chunk_size, action_dim)`.

Training (`forward`): the VAE encoder, a transformer encoder over `[cls, state, a_0 .. a_{k-1}]` (the
chunk's normalized actions, padded ones masked out, fixed sinusoidal positions), gives from its cls token the
mean and log-variance of z; a reparameterized sample of z conditions the decoder. Loss: the L1 error of the
normalized actions over the real (unpadded) ones, plus `kl_weight` times the KL divergence of z's
distribution from N(0, I) (summed over z's dimensions, averaged over the batch). With `use_vae=False` there is
no VAE encoder, z is always 0 and the loss is the L1 term. The reparameterization noise is the policy's only
per-sample training draw (`draw_training_noise`), so the trainer can give each sample the same noise on any
number of processes; dropout masks are drawn by each process (N-process training equals 1-process training
only with `dropout=0`).

Submodules are named as in LeRobot's `ACT` (`model.backbone`, `model.encoder`, `model.decoder`,
`model.vae_encoder`, `model.encoder_img_feat_input_proj`, `model.decoder_pos_embed`, ...) and compute the same
functions, so a LeRobot ACT state dict maps onto this model name for name. The transformer's layers and position
embeddings are in `lerobot.policies.act.transformer`.

Where LeRobot's ACT departs from the paper and its original code (details in docs/act.md):

- Decoder depth: the paper and the original code configure 7 decoder layers, but the original code only
  used the output of the first one (tonyzhaozh/act issue 25), so LeRobot, matching what actually ran, builds
  `n_decoder_layers=1`. Older LeRobot versions built the 7 layers and likewise ran only the first.
- Temporal ensembling (the paper's Algorithm 2, with m = 0.01 in the original code) is off by default and
  chunks of 100 actions are executed whole (`n_action_steps=100`); here ensembling lives in the `Policy`
  base class (`temporal_ensemble_coeff`) with LeRobot's online update.
- The robot state is optional, and an environment state vector (keypoints) may stand in for cameras, as an
  extra encoder token; the paper always has joint positions and four cameras.
- Normalization uses the dataset's mean/std for images too (the original code: ImageNet statistics), and
  LeRobot leaves the environment state unnormalized (this project normalizes it, see `ACTConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

import einops
import torch
import torchvision
from torch import Tensor, nn
from torchvision.ops.misc import FrozenBatchNorm2d

from lerobot.constants import ACTION_IS_PAD, LOSS_COUNT, TRAINING_NOISE_PREFIX
from lerobot.normalize import Normalize, Unnormalize
from lerobot.policies.act.configuration import ACTConfig
from lerobot.policies.act.transformer import (
    ACTDecoder,
    ACTEncoder,
    SinusoidalPositionEmbedding2d,
    sinusoidal_embedding_1d,
)
from lerobot.policies.images import resize
from lerobot.policies.policy import Policy, acting_settings

# The per-sample draw of a training batch (`ACTPolicy.draw_training_noise`): the reparameterization noise.
LATENT_NOISE = TRAINING_NOISE_PREFIX + "latent"  # (B, latent_dim) float32


# ---------------------------------------------------------------------------------- vision trunk
class ResNetTrunk(nn.Module):
    """A torchvision ResNet up to its last stage (`layer4`), under torchvision's module names:
    images `(N, C, H, W)` -> feature map `(N, C', H / 32, W / 32)` (H / 16 with the last stride dilated)."""

    def __init__(self, resnet: nn.Module):
        super().__init__()
        for name, module in resnet.named_children():
            if name == "avgpool":
                break
            self.add_module(name, module)

    def forward(self, images: Tensor) -> Tensor:
        """`images` (N, C, H, W) -> (N, C', h, w)."""
        for module in self.children():
            images = module(images)
        return images


def make_backbone(config: ACTConfig, in_channels: int) -> tuple[ResNetTrunk, int]:
    """The ResNet trunk of `config` (frozen BatchNorm: its statistics and affine terms are fixed buffers) and
    its output channels."""
    resnet = torchvision.models.get_model(
        config.vision_backbone,
        weights=config.pretrained_backbone_weights,
        replace_stride_with_dilation=[False, False, config.replace_final_stride_with_dilation],
        norm_layer=FrozenBatchNorm2d,
    )
    if in_channels != 3:
        resnet.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return ResNetTrunk(resnet), resnet.fc.in_features


# ---------------------------------------------------------------------------------- the network
class ACT(nn.Module):
    """The network of `ACTPolicy`: the CVAE encoder (`vae_encoder*`, with `use_vae`) and the transformer that
    decodes a chunk from the latent and the observation (everything else)."""

    def __init__(self, config: ACTConfig):
        super().__init__()
        self.config = config
        dim = config.dim_model
        state = config.state_feature
        env_state = config.env_state_feature
        images = config.image_features
        self.has_state = state is not None
        self.has_env_state = env_state is not None
        self.has_images = bool(images)
        task = config.task_feature
        self.has_task = task is not None

        if config.use_vae:
            self.vae_encoder = ACTEncoder(config, config.n_vae_encoder_layers)
            self.vae_encoder_cls_embed = nn.Embedding(1, dim)
            if state is not None:
                self.vae_encoder_robot_state_input_proj = nn.Linear(state[1], dim)
            self.vae_encoder_action_input_proj = nn.Linear(config.action_dim, dim)
            self.vae_encoder_latent_output_proj = nn.Linear(dim, 2 * config.latent_dim)
            # Fixed positions of [cls, state?, a_0 .. a_{k-1}] (1, S, D); a state-dict entry, as in LeRobot.
            n_tokens = 1 + int(state is not None) + config.chunk_size
            self.register_buffer("vae_encoder_pos_enc", sinusoidal_embedding_1d(n_tokens, dim)[None])

        if images:
            (shape,) = {tuple(s) for s in images.values()}
            self.backbone, feature_channels = make_backbone(config, in_channels=shape[0])
            self.resize_shape = tuple(config.resize_shape) if config.resize_shape is not None else None

        self.encoder = ACTEncoder(config, config.n_encoder_layers)
        self.decoder = ACTDecoder(config)

        # Encoder input tokens [latent, state?, env_state?, task?, camera pixels...].
        if state is not None:
            self.encoder_robot_state_input_proj = nn.Linear(state[1], dim)
        if env_state is not None:
            self.encoder_env_state_input_proj = nn.Linear(env_state[1], dim)
        self.encoder_latent_input_proj = nn.Linear(config.latent_dim, dim)
        if task is not None:  # one policy for several tasks: the task is one more encoder token
            self.encoder_task_embed = nn.Embedding(task[1], dim)
        if images:
            self.encoder_img_feat_input_proj = nn.Conv2d(feature_channels, dim, kernel_size=1)
        n_vector_tokens = 1 + int(state is not None) + int(env_state is not None) + int(task is not None)
        self.encoder_1d_feature_pos_embed = nn.Embedding(n_vector_tokens, dim)
        if images:
            self.encoder_cam_feat_pos_embed = SinusoidalPositionEmbedding2d(dim // 2)

        # Decoder: learned query positions (DETR's object queries), one per action of the chunk.
        self.decoder_pos_embed = nn.Embedding(config.chunk_size, dim)
        self.action_head = nn.Linear(dim, config.action_dim)

        # Xavier-uniform weights for the transformer's matrices, as the original code.
        for param in chain(self.encoder.parameters(), self.decoder.parameters()):
            if param.dim() > 1:
                nn.init.xavier_uniform_(param)

    def encode_latent(
        self, state: Tensor | None, actions: Tensor, action_is_pad: Tensor, noise: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The CVAE encoder: `(z, mu, log_sigma_x2)`, each `(B, latent_dim)`.

        Args:
            state: normalized robot state `(B, D_state)`, or None without a state input.
            actions: normalized action chunk `(B, chunk_size, A)`.
            action_is_pad: `(B, chunk_size)`, True at padded actions (masked out of the attention).
            noise: standard normal `(B, latent_dim)` for the reparameterization `z = mu + sigma * noise`.

        `log_sigma_x2` is `2 log(sigma)`, the log-variance, as LeRobot's (and the original code's) output.
        """
        batch_size = actions.shape[0]
        tokens = [einops.repeat(self.vae_encoder_cls_embed.weight, "1 d -> b 1 d", b=batch_size)]
        if state is not None:
            tokens.append(self.vae_encoder_robot_state_input_proj(state)[:, None])
        tokens.append(self.vae_encoder_action_input_proj(actions))  # (B, chunk_size, D)
        tokens = torch.cat(tokens, dim=1)  # (B, S, D)
        n_leading = tokens.shape[1] - actions.shape[1]  # cls (and state): never padding
        leading = torch.zeros(batch_size, n_leading, dtype=torch.bool, device=actions.device)
        mask = torch.cat([leading, action_is_pad], dim=1)  # (B, S)
        cls_out = self.vae_encoder(tokens, pos=self.vae_encoder_pos_enc, key_padding_mask=mask)[:, 0]
        params = self.vae_encoder_latent_output_proj(cls_out)  # (B, 2 * latent_dim)
        mu, log_sigma_x2 = params[:, : self.config.latent_dim], params[:, self.config.latent_dim :]
        z = mu + (log_sigma_x2 / 2).exp() * noise
        return z, mu, log_sigma_x2

    def forward(
        self,
        state: Tensor | None,
        env_state: Tensor | None,
        images: Tensor | None,
        latent: Tensor,
        task: Tensor | None = None,
    ) -> Tensor:
        """Decode a chunk: normalized `(B, chunk_size, A)` from the latent `(B, latent_dim)` and the normalized
        observation: `state` (B, D_state), `env_state` (B, D_env), `images` (B, N_cam, C, H, W) and the task
        ids `task` (B,) long, each None when the config has no such input."""
        tokens = [self.encoder_latent_input_proj(latent)]
        if self.has_state:
            tokens.append(self.encoder_robot_state_input_proj(state))
        if self.has_env_state:
            tokens.append(self.encoder_env_state_input_proj(env_state))
        if self.has_task:
            tokens.append(self.encoder_task_embed(task))
        tokens = torch.stack(tokens, dim=1)  # (B, n_vector_tokens, D)
        pos = self.encoder_1d_feature_pos_embed.weight[None]  # (1, n_vector_tokens, D)
        if self.has_images:
            n_cameras = images.shape[1]
            images = resize(einops.rearrange(images, "b n c h w -> (b n) c h w"), self.resize_shape)
            features = self.backbone(images)
            cam_pos = self.encoder_cam_feat_pos_embed(features).to(features.dtype)  # (1, D, h, w)
            features = self.encoder_img_feat_input_proj(features)  # (B * N_cam, D, h, w)
            features = einops.rearrange(features, "(b n) d h w -> b (n h w) d", n=n_cameras)
            cam_pos = einops.repeat(cam_pos, "1 d h w -> 1 (n h w) d", n=n_cameras)
            tokens = torch.cat([tokens, features], dim=1)
            pos = torch.cat([pos.to(cam_pos.dtype), cam_pos], dim=1)
        memory = self.encoder(tokens, pos=pos)  # (B, S, D)
        queries = memory.new_zeros(memory.shape[0], self.config.chunk_size, memory.shape[-1])  # (B, T, D)
        decoded = self.decoder(queries, memory, query_pos=self.decoder_pos_embed.weight[None], memory_pos=pos)
        return self.action_head(decoded)


# ---------------------------------------------------------------------------------- the policy
class ACTPolicy(Policy):
    """ACT acting from one observation step by chunks of `chunk_size` actions (see the module docstring).

    Args:
        config: an `ACTConfig` whose `input_features` / `output_features` are filled; validated here.
        dataset_stats: `{key: {"mean","std","min","max": Tensor}}` of the normalized features; None when the
            statistics come from a checkpoint loaded next (`load_state_dict`).

    `predict_action_chunk` runs in the module's mode: call `eval()` first (evaluation does) so that dropout is
    off.
    """

    def __init__(self, config: ACTConfig, dataset_stats: Mapping[str, Mapping[str, Tensor]] | None = None):
        config.validate()
        super().__init__(**acting_settings(config))
        self.config = config
        mapping = config.normalization_mapping
        self.normalize_inputs = Normalize(config.input_features, mapping, dataset_stats)
        self.normalize_targets = Normalize(config.output_features, mapping, dataset_stats)
        self.unnormalize_outputs = Unnormalize(config.output_features, mapping, dataset_stats)
        self.model = ACT(config)

        self.image_keys = list(config.image_features)
        state, env_state = config.state_feature, config.env_state_feature
        self.state_key = state[0] if state is not None else None
        self.env_state_key = env_state[0] if env_state is not None else None
        task = config.task_feature
        self.task_key = task[0] if task is not None else None
        self.action_key = config.action_key

    def optimizer_param_groups(self) -> list[dict]:
        """Two groups, as LeRobot's: everything but the vision trunk at `optimizer_lr`, the trunk
        (`model.backbone.*`) at `optimizer_lr_backbone`; the second only with a camera."""
        rest, backbone = [], []
        for name, param in self.named_parameters():
            if param.requires_grad:
                (backbone if name.startswith("model.backbone.") else rest).append(param)
        groups = [{"params": rest}]
        if backbone:
            groups.append({"params": backbone, "lr": self.config.optimizer_lr_backbone})
        return groups

    # ------------------------------------------------------------------ inputs
    @property
    def _observation_keys(self) -> list[str]:
        return [
            k for k in (*self.image_keys, self.state_key, self.env_state_key, self.task_key) if k is not None
        ]

    def _check_obs(self, batch: Mapping[str, Tensor]) -> None:
        for key in self._observation_keys:
            if key not in batch:
                raise KeyError(f"act policy needs {key!r} in the batch, got {sorted(batch)}")
            if batch[key].ndim < 2 or batch[key].shape[1] != 1:
                raise ValueError(f"{key!r} must be (B, n_obs_steps=1, ...), got {tuple(batch[key].shape)}")

    def _observation(self, batch: Mapping[str, Tensor]) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """`(state (B, D_state), env_state (B, D_env), images (B, N_cam, C, H, W))` of a normalized batch
        `(B, 1, ...)`, None for the inputs the config lacks."""
        state = batch[self.state_key][:, 0] if self.state_key else None
        env_state = batch[self.env_state_key][:, 0] if self.env_state_key else None
        images = torch.stack([batch[k][:, 0] for k in self.image_keys], dim=1) if self.image_keys else None
        return state, env_state, images

    def _task(self, batch: Mapping[str, Tensor]) -> Tensor | None:
        """The task ids `(B,)` long of a batch `(B, 1)`, None for a single-task config."""
        return batch[self.task_key][:, 0].round().long() if self.task_key else None

    def _zero_latent(self, batch_size: int) -> Tensor:
        """The latent at inference (and without the VAE): the prior's mean, `(B, latent_dim)` zeros."""
        weight = self.model.encoder_latent_input_proj.weight
        return torch.zeros(batch_size, self.config.latent_dim, dtype=weight.dtype, device=weight.device)

    # ------------------------------------------------------------------ training
    def draw_training_noise(self, n: int) -> dict[str, Tensor]:
        """The reparameterization noise of `n` samples (`LATENT_NOISE`, `(n, latent_dim)` standard normal
        from the CPU stream), when a training `forward` uses the VAE (`use_vae` and training mode); else {}."""
        if not (self.config.use_vae and self.training):
            return {}
        return {LATENT_NOISE: torch.randn((n, self.config.latent_dim), device="cpu")}

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The loss of one dataset batch.

        Args:
            batch: observations `(B, 1, ...)`, `action` `(B, chunk_size, A)` and optionally `action_is_pad`
                `(B, chunk_size)` (True past the episode's end). The reparameterization noise is read from
                its `LATENT_NOISE` entry when there, drawn here otherwise.

        Returns:
            `{"loss", "l1_loss", "kld_loss" (with the VAE in training mode), LOSS_COUNT}` scalars: `l1_loss`
            is the mean absolute error of the normalized actions over the real (unpadded) action values,
            `kld_loss` the KL divergence of the latent's distribution from N(0, I) summed over the latent's
            dimensions and averaged over the batch, `loss = l1_loss + kl_weight * kld_loss`; `LOSS_COUNT` is
            the number of real action values (not differentiable). In eval mode, or with `use_vae=False`, the
            latent is 0 and `loss = l1_loss`.
        """
        self._check_obs(batch)
        actions = batch[self.action_key]
        if actions.ndim != 3 or actions.shape[1] != self.config.chunk_size:
            raise ValueError(
                f"{self.action_key!r} must be (B, chunk_size={self.config.chunk_size}, A), "
                f"got {tuple(actions.shape)}"
            )
        batch_size = actions.shape[0]
        is_pad = batch.get(ACTION_IS_PAD)
        if is_pad is None:
            is_pad = torch.zeros(actions.shape[:2], dtype=torch.bool, device=actions.device)
        noise = batch.get(LATENT_NOISE)
        batch = self.normalize_targets(self.normalize_inputs(batch))
        actions = batch[self.action_key]
        state, env_state, images = self._observation(batch)

        use_vae = self.config.use_vae and self.training
        mu = log_sigma_x2 = None
        if use_vae:
            if noise is None:
                noise = self.draw_training_noise(batch_size)[LATENT_NOISE]
            noise = noise.to(actions.device, actions.dtype, non_blocking=True)
            latent, mu, log_sigma_x2 = self.model.encode_latent(state, actions, is_pad, noise)
        else:
            latent = self._zero_latent(batch_size)
        predicted = self.model(state, env_state, images, latent, self._task(batch))  # (B, chunk_size, A)

        error = (predicted.to(actions.dtype) - actions).abs()  # (B, chunk_size, A)
        real = einops.rearrange(~is_pad, "b t -> b t 1").to(error.dtype)
        count = real.sum() * error.shape[-1]  # real action values
        l1_loss = (error * real).sum() / count.clamp_min(1.0)
        output = {"l1_loss": l1_loss.detach(), LOSS_COUNT: count}
        loss = l1_loss
        if mu is not None:
            kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(dim=-1).mean()
            loss = l1_loss + self.config.kl_weight * kld
            output["kld_loss"] = kld.detach()
        output["loss"] = loss
        return output

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Actions from the current step on, `(B, chunk_size, A)` in the data's units, from observations
        `(B, 1, ...)`; the latent is 0 (the prior's mean)."""
        self._check_obs(batch)
        batch = self.normalize_inputs(batch)
        state, env_state, images = self._observation(batch)
        batch_size = next(t for t in (state, env_state, images) if t is not None).shape[0]
        actions = self.model(state, env_state, images, self._zero_latent(batch_size), self._task(batch))
        return self.unnormalize_outputs({self.action_key: actions})[self.action_key]
