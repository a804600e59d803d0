"""Diffusion Policy: config, shapes, sampling, alignment, loss masking, checkpoints, learning (tiny configs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lerobot.accel import accelerated
from lerobot.accel import diffusion as accel_diffusion
from lerobot.accel.diffusion import (
    INT8_MAX_ROWS,
    PreparedLinear,
    UnetPlan,
    _TimeConv,
    _Upsample,
    quantize_int8,
)
from lerobot.checkpoints.run import load_config
from lerobot.cli import compose_config
from lerobot.config import EnvConfig, FeatureConfig, InferenceConfig, env_config
from lerobot.constants import LOSS_COUNT
from lerobot.errors import ConfigError
from lerobot.policies.diffusion.configuration import DiffusionConfig
from lerobot.policies.diffusion.modeling import (
    ACTION_NOISE,
    CROP_OFFSETS,
    TIMESTEPS,
    DiffusionPolicy,
    edge_pad_actions,
)
from lerobot.policies.diffusion.unet import ConditionalUnet1D, TemporalConv1d, TemporalUpsample1d
from lerobot.policies.diffusion.vision import (
    AutocastFriendlyConv2d,
    RgbEncoder,
    SpatialSoftmax,
    center_crop,
    random_crop,
    resize,
)
from lerobot.policy_registry import make_policy, make_policy_config, validate_run_config

STATE = FeatureConfig(shape=[2], kind="state", low=[0.0, 0.0], high=[512.0, 512.0])
ACTION = FeatureConfig(shape=[2], kind="action", low=[0.0, 0.0], high=[512.0, 512.0])
IMAGE = FeatureConfig(shape=[3, 32, 32], kind="visual")
REPO_ROOT = Path(__file__).resolve().parents[1]
KEYPOINTS = FeatureConfig(shape=[4], kind="env_state", low=[0.0], high=[512.0])


def image_config(**overrides) -> DiffusionConfig:
    """Images 3x32x32 cropped to 28x28, a 2-level U-Net of width 16/32, 10 diffusion steps."""
    fields = dict(
        input_features={"observation.image": IMAGE, "observation.state": STATE},
        output_features={"action": ACTION},
        down_dims=[16, 32],
        diffusion_step_embed_dim=16,
        spatial_softmax_num_keypoints=4,
        crop_shape=[28, 28],
        num_train_timesteps=10,
    )
    return DiffusionConfig(**{**fields, **overrides})


def keypoint_config(**overrides) -> DiffusionConfig:
    """Low-dimensional: 4 'keypoint' numbers plus the state, horizon 8, a 2-level U-Net of width 32/64."""
    fields = dict(
        input_features={"observation.environment_state": KEYPOINTS, "observation.state": STATE},
        output_features={"action": ACTION},
        down_dims=[32, 64],
        diffusion_step_embed_dim=32,
        horizon=8,
        n_action_steps=4,
        num_train_timesteps=50,
    )
    return DiffusionConfig(**{**fields, **overrides})


def stats_for(config: DiffusionConfig) -> dict[str, dict[str, Tensor]]:
    stats = {}
    for key, feature in {**config.input_features, **config.output_features}.items():
        if feature.kind == "visual":
            stats[key] = {"mean": torch.full((3, 1, 1), 0.4), "std": torch.full((3, 1, 1), 0.25)}
        else:
            stats[key] = {"min": torch.zeros(feature.shape), "max": torch.full(feature.shape, 512.0)}
    return stats


def obs_batch(config: DiffusionConfig, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    """Random observations (B, n_obs_steps, ...) for every input feature of `config`."""
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for key, feature in config.input_features.items():
        shape = (batch_size, config.n_obs_steps, *feature.shape)
        batch[key] = torch.rand(shape, generator=g) * (1.0 if feature.kind == "visual" else 512.0)
    return batch


def train_batch(config: DiffusionConfig, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    batch = obs_batch(config, batch_size, seed)
    batch["action"] = torch.rand(batch_size, config.horizon, config.action_dim, generator=g) * 512
    batch["action_is_pad"] = torch.zeros(batch_size, config.horizon, dtype=torch.bool)
    return batch


# ---------------------------------------------------------------------- configuration
def test_delta_timestamps_and_modality_defaults():
    config = DiffusionConfig(
        input_features={
            "observation.image": FeatureConfig([3, 96, 96], "visual"),
            "observation.state": STATE,
        },
        output_features={"action": ACTION},
    )
    config.validate()
    assert (config.down_dims, config.batch_size) == (None, None)  # validating changes nothing
    config.resolve_defaults()
    assert (config.down_dims, config.batch_size) == ([512, 1024, 2048], 64)
    deltas = config.delta_timestamps(10)
    assert deltas["observation.image"] == deltas["observation.state"] == [-0.1, 0.0]
    assert deltas["action"] == pytest.approx([i / 10 for i in range(-1, 15)])
    assert deltas["action"][0] == -0.1 and deltas["action"][-1] == pytest.approx(1.4)

    low_dim = keypoint_config(down_dims=None, horizon=16, n_action_steps=8)
    low_dim.resolve_defaults()
    assert (low_dim.down_dims, low_dim.batch_size) == ([256, 512, 1024], 256)
    assert set(low_dim.delta_timestamps(10)) == {
        "observation.environment_state",
        "observation.state",
        "action",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(output_features={}), "no output"),
        (dict(output_features={"action": ACTION, "action2": ACTION}), "exactly one action feature"),
        (dict(input_features={"observation.image": IMAGE}), "'state'"),
        (dict(input_features={"observation.state": STATE}), "a visual input or an env_state input"),
        (dict(horizon=8, n_action_steps=8), "horizon=8 must be >= n_action_steps"),
        (dict(horizon=18, down_dims=[16, 32, 64]), "divisible by 2\\*\\*\\(len\\(down_dims\\)-1\\)=4"),
        (dict(crop_shape=[40, 28]), "does not fit in the image"),
        (dict(resize_shape=[24, 24]), "does not fit in policy.resize_shape=\\(24, 24\\)"),
        (dict(resize_shape=[0, 24]), "resize_shape=\\[0, 24\\] must be"),
        (dict(inference_scheduler="Euler"), "inference_scheduler='Euler'"),
        (dict(num_inference_steps=11), "num_inference_steps=11"),
        (dict(down_dims=[12, 32]), "n_groups=8 must divide"),
        (dict(kernel_size=4), "kernel_size=4 must be odd"),
        (dict(pretrained_backbone_weights="IMAGENET1K_V1"), "use_group_norm=false"),
        (dict(normalization_mapping={"visual": "zscore"}), "normalization_mapping.visual='zscore'"),
        (dict(vision_backbone_stages=5), "vision_backbone_stages=5 must be 1, 2, 3 or 4"),
        (dict(vision_backbone_stages=0), "vision_backbone_stages=0"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        image_config(**overrides).validate()


def test_defaults_and_factory_build_both_paper_configs():
    """`policy=diffusion` (the dataclass defaults) with both PushT envs; built on the meta device to count
    parameters."""
    section = {"name": "diffusion"}
    counts = {}
    for env_name in ("pusht", "pusht_keypoints"):
        env_yaml = OmegaConf.load(REPO_ROOT / f"configs/env/{env_name}.yaml")
        env = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), env_yaml))
        config = make_policy_config(section, env)
        with torch.device("meta"):
            policy = make_policy(config)
        assert isinstance(policy, DiffusionPolicy)
        counts[env_name] = sum(p.numel() for p in policy.parameters())
    # The paper's CNN-based image policy has about 260M parameters (ResNet-18 11.2M + U-Net 251.5M).
    assert 255e6 < counts["pusht"] < 270e6
    assert 60e6 < counts["pusht_keypoints"] < 66e6


# ---------------------------------------------------------------------- U-Net
@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "length"), [(5, 1, 2, 16), (3, 2, 1, 16), (3, 2, 1, 5), (1, 1, 0, 4)]
)
def test_matmul_convolution_equals_conv1d(kernel, stride, padding, length):
    conv = TemporalConv1d(6, 8, kernel, stride=stride, padding=padding)
    reference = nn.Conv1d(6, 8, kernel, stride=stride, padding=padding)
    with (
        torch.no_grad()
    ):  # the same parameters: Conv1d's (C_out, C_in, k) weight flattened to (C_out, C_in*k)
        reference.weight.copy_(conv.weight.view(8, 6, kernel))
        reference.bias.copy_(conv.bias)
    x = torch.randn(3, 6, length, requires_grad=True)
    torch.testing.assert_close(conv(x), reference(x))
    (grad,) = torch.autograd.grad(conv(x).square().sum(), x)
    (expected,) = torch.autograd.grad(reference(x).square().sum(), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("length", [1, 4, 7])
def test_matmul_upsampling_equals_conv_transpose1d(length):
    upsample = TemporalUpsample1d(6)
    reference = nn.ConvTranspose1d(6, 6, 4, stride=2, padding=1)
    reference.load_state_dict(upsample.state_dict())  # the same parameter names and shapes
    x = torch.randn(3, 6, length, requires_grad=True)
    torch.testing.assert_close(upsample(x), reference(x))
    (grad,) = torch.autograd.grad(upsample(x).square().sum(), x)
    (expected,) = torch.autograd.grad(reference(x).square().sum(), x)
    torch.testing.assert_close(grad, expected)
    (weight_grad,) = torch.autograd.grad(upsample(x).square().sum(), upsample.weight)
    (expected,) = torch.autograd.grad(reference(x).square().sum(), reference.weight)
    torch.testing.assert_close(weight_grad, expected)


# ---------------------------------------------------------------------- vision
def test_spatial_softmax_finds_the_peak():
    pool = SpatialSoftmax((1, 5, 7), num_keypoints=1)
    with torch.no_grad():
        pool.keypoint_proj.weight.fill_(1.0)
        pool.keypoint_proj.bias.zero_()
    features = torch.zeros(2, 1, 5, 7)
    features[0, 0, 0, 6] = 50.0  # top-right: x=+1, y=-1
    features[1, 0, 2, 3] = 50.0  # center
    torch.testing.assert_close(pool(features), torch.tensor([[[1.0, -1.0]], [[0.0, 0.0]]]), atol=1e-4, rtol=0)


def test_crops_and_group_norm_encoder():
    images = torch.arange(2 * 3 * 10 * 12, dtype=torch.float32).view(2, 3, 10, 12)
    crops = random_crop(images, (4, 5), generator=torch.Generator().manual_seed(0))
    assert crops.shape == (2, 3, 4, 5)
    for n in range(2):
        # Each crop is a window of its own image: find its top-left corner from the first pixel.
        top, left = divmod(int(crops[n, 0, 0, 0].item()) - n * 360, 12)
        torch.testing.assert_close(crops[n], images[n, :, top : top + 4, left : left + 5])
    torch.testing.assert_close(center_crop(images, (4, 6)), images[..., 3:7, 3:9])

    encoder = RgbEncoder(image_config())
    assert not any(isinstance(m, nn.BatchNorm2d) for m in encoder.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in encoder.modules())
    x = torch.rand(3, 3, 32, 32)
    encoder.eval()
    torch.testing.assert_close(encoder(x), encoder(x))  # center crop: deterministic
    assert encoder(x).shape == (3, encoder.feature_dim)


def test_fewer_backbone_stages_keep_the_first_stages_and_a_finer_feature_map():
    """`vision_backbone_stages=3` is the 4-stage encoder without its last stage: the same weights for the
    stages it keeps (same names), a feature map twice as fine for the spatial softmax, ResNet-18's 8.4M
    last-stage weights gone, and a policy that trains end to end."""
    torch.manual_seed(0)
    full = RgbEncoder(image_config())
    three = RgbEncoder(image_config(vision_backbone_stages=3))
    # 28x28 crops: 4 stages leave 1x1 (stride 32), 3 stages 2x2 (stride 16), with 256 channels.
    assert full.pool.grid.shape == (1, 2) and three.pool.grid.shape == (4, 2)
    assert three.pool.keypoint_proj.in_channels == 256
    full_backbone, three_backbone = full.backbone.state_dict(), three.backbone.state_dict()
    assert set(three_backbone) == {name for name in full_backbone if not name.startswith("7.")}
    dropped = sum(p.numel() for n, p in full.backbone.named_parameters() if n.startswith("7."))
    assert 8.3e6 < dropped < 8.5e6
    three.backbone.load_state_dict({n: full_backbone[n] for n in three_backbone})
    x = torch.rand(2, 3, 28, 28)
    torch.testing.assert_close(three.backbone(x), full.backbone[:7](x))

    config = image_config(vision_backbone_stages=3)
    config.validate()
    policy = DiffusionPolicy(config, stats_for(config))
    policy(train_batch(config, 2))["loss"].backward()
    assert policy.rgb_encoder.backbone[6][0].conv1.weight.grad is not None
    policy.eval()
    assert policy.predict_action_chunk(obs_batch(config, 2)).shape == (2, config.horizon - 1, 2)


def test_resize_before_crop_is_an_encoder_on_smaller_images():
    """`resize_shape` shrinks the images (antialiased) before the crop: the encoder equals one built for
    images of that size fed with the resized images, and a constant image stays constant."""
    config = image_config(resize_shape=[20, 20], crop_shape=[16, 16])
    config.validate()
    torch.manual_seed(0)
    encoder = RgbEncoder(config).eval()
    small = image_config(
        input_features={
            "observation.image": FeatureConfig(shape=[3, 20, 20], kind="visual"),
            "observation.state": STATE,
        },
        crop_shape=[16, 16],
    )
    reference = RgbEncoder(small).eval()
    reference.load_state_dict(encoder.state_dict())
    x = torch.rand(3, 3, 32, 32)
    shrunk = resize(x, (20, 20))
    assert shrunk.shape == (3, 3, 20, 20)
    torch.testing.assert_close(encoder(x), reference(shrunk))
    flat = torch.full((1, 3, 32, 32), 0.25)
    torch.testing.assert_close(resize(flat, (20, 20)), torch.full((1, 3, 20, 20), 0.25))
    assert resize(x, None) is x and resize(x, (32, 32)) is x


def test_autocast_friendly_conv_matches_conv2d():
    """Same parameters as nn.Conv2d; under CPU autocast the same bf16 forward, an fp32 weight gradient."""
    torch.manual_seed(0)
    reference = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    conv = AutocastFriendlyConv2d(4, 6, 3, stride=2, padding=1)
    conv.load_state_dict(reference.state_dict())
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    torch.testing.assert_close(conv(x), reference(x))  # no autocast: plain Conv2d
    grads = []
    for module in (conv, reference):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = module(x)
        assert y.dtype == torch.bfloat16
        grads.append(torch.autograd.grad(y.float().square().sum(), [x, module.weight, module.bias]))
    for got, expected in zip(*grads):
        assert got.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)
    encoder = RgbEncoder(image_config())
    assert any(isinstance(m, AutocastFriendlyConv2d) for m in encoder.modules())
    assert not any(type(m) is nn.Conv2d for m in encoder.modules())


# ---------------------------------------------------------------------- shapes
@pytest.mark.parametrize("make_config", [image_config, keypoint_config])
def test_forward_and_predict_shapes(make_config):
    config = make_config()
    policy = DiffusionPolicy(config, stats_for(config))
    out = policy(train_batch(config, 3))
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in policy.unet.parameters())
    policy.eval()
    chunk = policy.predict_action_chunk(obs_batch(config, 3))
    assert chunk.shape == (3, config.horizon - config.n_obs_steps + 1, 2)
    assert torch.isfinite(chunk).all()
    # clip_sample keeps normalized actions in [-1, 1], i.e. within the statistics' [0, 512].
    assert chunk.min() >= 0.0 and chunk.max() <= 512.0 + 1e-3


def test_wrong_history_length_is_rejected():
    config = keypoint_config()
    policy = DiffusionPolicy(config, stats_for(config))
    batch = obs_batch(config, 2)
    batch["observation.state"] = batch["observation.state"][:, :1]
    with pytest.raises(ValueError, match="n_obs_steps=2"):
        policy.predict_action_chunk(batch)


# ---------------------------------------------------------------------- sampling
class OracleUnet(nn.Module):
    """Predicts the exact noise for known clean actions `target` (B, horizon, A): a perfect denoiser."""

    # The sampler's interface of the U-Net, around the oracle's `forward`.
    condition = ConditionalUnet1D.condition
    denoise = ConditionalUnet1D.denoise

    def __init__(self, scheduler, target: Tensor):
        super().__init__()
        self.alphas_cumprod = scheduler.alphas_cumprod
        self.target = target
        self.calls = 0

    def forward(self, sample: Tensor, step: Tensor, global_cond: Tensor) -> Tensor:
        self.calls += 1
        alpha_bar = self.alphas_cumprod[step].view(-1, 1, 1)
        return (sample - alpha_bar.sqrt() * self.target) / (1 - alpha_bar).sqrt()


@pytest.mark.parametrize(("scheduler", "steps", "expected_calls"), [("DDPM", None, 10), ("DDIM", 3, 3)])
def test_sampler_recovers_clean_actions_and_chunk_starts_now(scheduler, steps, expected_calls):
    """With a perfect denoiser, sampling returns the clean horizon, sliced from index n_obs_steps - 1."""
    config = image_config(n_obs_steps=3, horizon=16)
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    # The inference scheduler is read from the config at every call: evaluation can switch it.
    policy.config.inference_scheduler, policy.config.num_inference_steps = scheduler, steps
    # Normalized horizon: index i holds (i / 10 - 0.8, -(i / 10 - 0.8)), all within [-1, 1].
    ramp = torch.arange(config.horizon) / 10 - 0.8
    target = torch.stack([ramp, -ramp], dim=-1).expand(2, -1, -1)
    policy.unet = OracleUnet(policy.noise_scheduler, target)
    chunk = policy.predict_action_chunk(obs_batch(config, 2), generator=torch.Generator().manual_seed(0))
    assert policy.unet.calls == expected_calls
    expected = (target[:, config.n_obs_steps - 1 :] + 1) / 2 * 512  # unnormalized, from "now" on
    torch.testing.assert_close(chunk, expected, atol=1e-2, rtol=0)


def test_select_action_executes_the_chunk_from_the_current_step():
    """Through the base class: the first n_action_steps of the returned chunk, in order, then a new chunk."""
    config = keypoint_config(inference_scheduler="DDIM", num_inference_steps=2)
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    first_obs = {k: v[:, -1] for k, v in obs_batch(config, 2).items()}  # (B, ...) as from an env
    history = {
        k: v.unsqueeze(1).repeat(1, config.n_obs_steps, *[1] * (v.ndim - 1)) for k, v in first_obs.items()
    }
    expected = policy.predict_action_chunk(history, generator=torch.Generator().manual_seed(7))

    policy.generator = torch.Generator().manual_seed(7)
    policy.reset()
    for i in range(config.n_action_steps):
        torch.testing.assert_close(policy.select_action(first_obs), expected[:, i])
    calls = []
    policy.unet.register_forward_hook(lambda *args: calls.append(1))
    policy.select_action(first_obs)  # the queue is empty: a new chunk is generated
    assert len(calls) == 2


def test_generator_makes_chunks_reproducible_and_ddpm_is_stochastic():
    config = image_config()
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    obs = obs_batch(config, 2)
    a = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(1))
    b = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(1))
    c = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a, c)


def test_bf16_autocast_stays_close_to_fp32():
    config = keypoint_config(inference_scheduler="DDIM", num_inference_steps=5)
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    obs = obs_batch(config, 4)
    fp32 = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(0))
    with accelerated(policy, InferenceConfig(dtype="bfloat16")):
        bf16 = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(0))
    assert bf16.dtype == torch.float32
    # bf16 keeps ~3 significant digits; in [0, 512] pixel units a few pixels of drift is the expected scale.
    assert (bf16 - fp32).abs().max() < 10.0
    assert not torch.equal(bf16, fp32)


# ---------------------------------------------------------------------- loss
def test_edge_pad_actions():
    actions = torch.arange(6, dtype=torch.float32).view(1, 6, 1).repeat(2, 1, 2)
    is_pad = torch.tensor([[True, False, False, True, True, True], [False] * 5 + [True]])
    filled = edge_pad_actions(actions, is_pad)
    assert filled[0, :, 0].tolist() == [1, 1, 2, 2, 2, 2]
    assert filled[1, :, 0].tolist() == [0, 1, 2, 3, 4, 4]


def test_loss_ignores_padded_actions():
    config = keypoint_config()
    policy = DiffusionPolicy(config, stats_for(config))
    batch = train_batch(config, 4)
    batch["action_is_pad"][:, 5:] = True
    batch["action_is_pad"][0, 0] = True

    def loss(b):
        torch.manual_seed(0)  # same noise and diffusion steps
        return policy(b)["loss"].item()

    reference = loss(batch)
    changed = dict(batch, action=batch["action"].clone())
    changed["action"][:, 5:] = torch.rand(4, 3, 2) * 512
    changed["action"][0, 0] = 7.0
    assert loss(changed) == reference
    changed["action"][1, 2] += 100.0  # a real action: the loss must see it
    assert loss(changed) != reference
    # Fully padded samples contribute nothing; an all-padded batch does not divide by zero.
    all_pad = dict(batch, action_is_pad=torch.ones_like(batch["action_is_pad"]))
    assert loss(all_pad) == 0.0


def test_training_draws_come_from_the_batch_or_are_drawn_as_forward_draws_them():
    config = image_config()
    policy = DiffusionPolicy(config, stats_for(config)).train()
    batch = train_batch(config, 3)
    torch.manual_seed(0)
    draws = policy.draw_training_noise(3)
    assert draws[CROP_OFFSETS].shape == (3, config.n_obs_steps, 1, 2)
    assert draws[ACTION_NOISE].shape == (3, config.horizon, config.action_dim)
    assert draws[TIMESTEPS].shape == (3,)
    # A batch without draws: forward makes the same draws itself, in the same order.
    torch.manual_seed(0)
    own = policy(batch)["loss"]
    assert torch.equal(policy({**batch, **draws})["loss"], own)
    # Given draws are the ones used: other noise, another loss.
    other = {**draws, ACTION_NOISE: torch.randn_like(draws[ACTION_NOISE])}
    assert not torch.equal(policy({**batch, **other})["loss"], own)
    # Evaluation crops centrally: no crop offsets to draw.
    assert CROP_OFFSETS not in policy.eval().draw_training_noise(3)


def test_shards_weighed_by_their_counts_give_the_global_loss_and_gradient():
    # What the trainer does on 2 processes: each shard's loss is the plain masked mean over its own real
    # actions; weighed by `count * 2 / global count` they average to the global batch's loss and gradient.
    config = keypoint_config()
    policy = DiffusionPolicy(config, stats_for(config))
    batch = train_batch(config, 8)
    batch["action_is_pad"][1, 3:] = True  # the shards hold different counts of real actions
    batch["action_is_pad"][6, 6:] = True
    batch["action_is_pad"][7, 2:] = True
    batch = {**batch, **policy.draw_training_noise(8)}
    params = [p for p in policy.parameters() if p.requires_grad]

    whole = policy(batch)
    assert whole[LOSS_COUNT] == (~batch["action_is_pad"]).sum() * config.action_dim
    whole_grads = torch.autograd.grad(whole["loss"], params)
    shards = [policy({k: v[i * 4 : (i + 1) * 4] for k, v in batch.items()}) for i in range(2)]
    total = sum(shard[LOSS_COUNT] for shard in shards)
    assert total == whole[LOSS_COUNT]
    weighed = [shard["loss"] * shard[LOSS_COUNT] * 2 / total for shard in shards]
    torch.testing.assert_close(sum(weighed) / 2, whole["loss"], rtol=1e-6, atol=0)
    shard_grads = [torch.autograd.grad(loss, params) for loss in weighed]
    for g_whole, g_first, g_second in zip(whole_grads, *shard_grads):
        scale = g_whole.abs().max().clamp_min(1e-12)  # float rounding, relative to the tensor's size
        torch.testing.assert_close((g_first + g_second) / 2 / scale, g_whole / scale, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------- checkpoints
def test_save_load_gives_identical_actions(tmp_path):
    config = image_config(inference_scheduler="DDIM", num_inference_steps=4)
    policy = DiffusionPolicy(config, stats_for(config))
    # Make the weights differ from a fresh init, so loading really matters.
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_file(policy.state_dict(), tmp_path / "model.safetensors")

    loaded = DiffusionPolicy(replace(config), dataset_stats=None)
    obs = obs_batch(config, 2)
    with pytest.raises(RuntimeError, match="statistics not loaded"):
        loaded.predict_action_chunk(obs)
    loaded.load_state_dict(load_file(tmp_path / "model.safetensors"))
    policy.eval(), loaded.eval()
    expected = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(3))
    actual = loaded.predict_action_chunk(obs, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------- learning
def test_overfits_a_few_samples_and_reproduces_their_actions():
    """Four samples whose observations encode the time step t; actions are a ramp over env steps.

    After a few hundred steps the loss falls by a large factor, and DDPM sampling returns each sample's
    actions from the current step on: chunk[0] is the action at step t, not t - 1 (the alignment).
    """
    torch.manual_seed(0)
    config = keypoint_config()
    policy = DiffusionPolicy(config, stats_for(config))
    times = torch.tensor([2.0, 4.0, 6.0, 8.0])

    def action_at(t: Tensor) -> Tensor:  # 35 px per step, so neighbouring steps are far apart
        return torch.stack([t * 35, 490 - t * 35], dim=-1)

    obs_steps = times[:, None] + torch.arange(1 - config.n_obs_steps, 1)  # (4, n_obs_steps)
    act_steps = times[:, None] + torch.arange(1 - config.n_obs_steps, config.horizon - config.n_obs_steps + 1)
    obs = {
        "observation.state": torch.stack([obs_steps * 30, obs_steps * 30], dim=-1),
        "observation.environment_state": torch.stack(
            [obs_steps * 30, 512 - obs_steps * 30, obs_steps * 15, 256 + obs_steps * 5], dim=-1
        ),
    }
    data = {**obs, "action": action_at(act_steps)}
    # Repeat the four samples so every batch sees many diffusion steps.
    batch = {k: v.repeat(8, *[1] * (v.ndim - 1)) for k, v in data.items()}

    def eval_loss() -> float:
        state = torch.random.get_rng_state()
        torch.manual_seed(123)
        with torch.no_grad():
            value = sum(policy(batch)["loss"].item() for _ in range(4)) / 4
        torch.random.set_rng_state(state)
        return value

    n_steps = 400
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, n_steps)
    initial = eval_loss()
    for _ in range(n_steps):
        loss = policy(batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    final = eval_loss()
    print(f"loss {initial:.3f} -> {final:.4f}")
    assert final < initial / 30, (initial, final)

    policy.eval()
    chunk = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(0))
    expected = data["action"][:, config.n_obs_steps - 1 :]
    error = (chunk - expected).abs()
    print(f"max error {error.max():.1f} px, mean {error.mean():.1f} px")
    assert error.max() < 40.0, error.max()
    # chunk[0] is closest to the action of the current step t, not t - 1 or t + 1.
    for offset in (-1, 1):
        assert (chunk[:, 0] - action_at(times)).abs().mean() < (
            chunk[:, 0] - action_at(times + offset)
        ).abs().mean()


# ---------------------------------------------------------------------- fast inference layer
# The plan's fp32 reformulation differs from the modules by rounding, which the sampler amplifies to a few
# millionths of the action range on the x86-64 CPUs we ran (Intel with AMX, AMD without). The tolerance is
# 1e-5 of the range (0.005 of 512 px); a formulation mistake (a tap, a bias, a FiLM slice) moves actions
# by pixels.
FP32_ATOL = 1e-5 * (ACTION.high[0] - ACTION.low[0])


def _perturbed(policy: DiffusionPolicy) -> DiffusionPolicy:
    """Weights away from their initialization (zero-initialized biases would hide layout mistakes)."""
    torch.manual_seed(5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy.eval()


def chunk_of(policy: DiffusionPolicy, obs: dict[str, Tensor], seed: int = 0) -> Tensor:
    return policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(seed))


def layer_chunk(policy: DiffusionPolicy, obs: dict[str, Tensor], **options) -> Tensor:
    """A chunk generated inside the policy's inference layer, with the settings `options` (`InferenceConfig`)."""
    with accelerated(policy, InferenceConfig(**options)):
        return chunk_of(policy, obs)


@pytest.mark.parametrize(
    ("make_config", "overrides"),
    [
        (image_config, dict(inference_scheduler="DDIM", num_inference_steps=4)),
        (image_config, dict(use_film_scale_modulation=False)),
        (keypoint_config, dict(down_dims=[16, 32, 64], horizon=8, num_train_timesteps=12)),
    ],
)
def test_fast_path_fp32_equals_the_modules(make_config, overrides):
    """Same weights, same noise: the plan's reformulation (time-major matmuls, matmul upsampling, hoisted
    FiLM, prepacked weights) reproduces the modules up to float rounding, for DDPM (stochastic) too."""
    config = make_config(**overrides)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))
    obs = obs_batch(config, 3)
    reference = chunk_of(policy, obs)
    fast = layer_chunk(policy, obs, fast=True)
    torch.testing.assert_close(fast, reference, atol=FP32_ATOL, rtol=0)


def test_fast_path_bf16_stays_close_to_fp32():
    config = image_config(inference_scheduler="DDIM", num_inference_steps=5)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))
    obs = obs_batch(config, 4)
    fp32 = chunk_of(policy, obs)
    autocast = layer_chunk(policy, obs, dtype="bfloat16")
    bf16 = layer_chunk(policy, obs, fast=True, dtype="bfloat16")
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)
    # bf16 keeps ~3 significant digits. This untrained, perturbed network amplifies rounding more than a
    # trained one (docs/benchmarks.md has the trained policy's figures): in [0, 512] pixel units, a mean of
    # a pixel or two, as bf16 autocast over the modules gives.
    error, autocast_error = (bf16 - fp32).abs().mean(), (autocast - fp32).abs().mean()
    assert error < 4.0 and error < 2 * autocast_error + 0.5, (error, autocast_error)


def test_int8_quantization_error_is_bounded():
    torch.manual_seed(0)
    weight = torch.randn(6, 32)
    weight[1, 3] = 40.0  # an outlier only coarsens its own row's scale
    weight[4] = 0.0
    quantized, scale = quantize_int8(weight)
    assert quantized.dtype == torch.int8 and quantized.abs().max() <= 127 and scale.shape == (6,)
    error = (quantized.float() * scale[:, None] - weight).abs()
    assert torch.all(error <= scale[:, None] / 2 + 1e-7)
    assert torch.all(quantized[4] == 0)
    assert scale[1] > 10 * scale[0]


def test_int8_weights_are_read_by_matmuls_with_few_rows_only():
    torch.manual_seed(0)
    weight, bias = torch.randn(24, 48), torch.randn(24)
    bf16 = PreparedLinear(weight, bias, torch.bfloat16)
    int8 = PreparedLinear(weight, bias, torch.bfloat16, int8=True)
    quantized, scale = quantize_int8(weight)
    dequantized = quantized.float() * scale.bfloat16().float()[:, None]
    few = torch.randn(INT8_MAX_ROWS, 48).bfloat16()
    torch.testing.assert_close(
        int8(few).float(), few.float() @ dequantized.T + bias.bfloat16().float(), atol=0.05, rtol=0.02
    )
    assert not torch.equal(int8(few), bf16(few))
    many = torch.randn(INT8_MAX_ROWS + 1, 48).bfloat16()
    assert torch.equal(int8(many), bf16(many))
    # The int8 kernel needs K % 16 == 0 (it crashes otherwise): such layers keep bf16 only.
    assert PreparedLinear(torch.randn(8, 10), None, torch.bfloat16, int8=True).int8_weight is None


def test_fast_path_int8_weights_stay_close_to_fp32():
    """At batch 1 the deepest level's matmuls (4 rows) read int8 weights; at batch 2 none does."""
    config = keypoint_config(down_dims=[32, 64], horizon=8, inference_scheduler="DDIM", num_inference_steps=5)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))

    def chunks(**options) -> list[Tensor]:
        return [layer_chunk(policy, obs_batch(config, b), **options) for b in (1, 2)]

    fp32 = chunks()
    bf16 = chunks(fast=True, dtype="bfloat16")
    int8 = chunks(fast=True, dtype="bfloat16", int8_weights=True)
    assert not torch.equal(int8[0], bf16[0]) and torch.equal(int8[1], bf16[1])
    # int8 per-channel weights carry ~2-3x bf16's rounding error on the layers that use them.
    error, bf16_error = (int8[0] - fp32[0]).abs().mean(), (bf16[0] - fp32[0]).abs().mean()
    assert error < 4.0 and error < 3 * bf16_error + 0.5, (error, bf16_error)


def test_plan_layers_equal_their_modules():
    torch.manual_seed(0)
    x = torch.randn(3, 6, 8)  # (B, C, T)
    for conv in (
        TemporalConv1d(6, 5, 5, padding=2),
        TemporalConv1d(6, 5, 3, stride=2, padding=1),
        TemporalConv1d(6, 5, 1),
    ):
        plan = _TimeConv(conv, torch.float32, prepack=True)
        torch.testing.assert_close(plan(x.transpose(1, 2)), conv(x).transpose(1, 2))
    upsample = nn.ConvTranspose1d(6, 6, 4, stride=2, padding=1)
    for prepack in (False, True):
        plan = _Upsample(upsample, torch.float32, prepack=prepack)
        torch.testing.assert_close(plan(x.transpose(1, 2)), upsample(x).transpose(1, 2))
    with pytest.raises(ValueError, match="kernel_size=4, stride=2, padding=1"):
        _Upsample(nn.ConvTranspose1d(6, 6, 3, stride=2), torch.float32, prepack=False)


def test_fast_inference_context_uses_the_weights_at_its_entry(tmp_path):
    """The plan is built from the weights when the `with` starts and dropped when it ends: the plain model
    is back afterwards, and the next `with` sees weights changed in between (training, a load)."""
    config = keypoint_config(inference_scheduler="DDIM", num_inference_steps=3)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))
    obs = obs_batch(config, 2)
    plain, unet = chunk_of(policy, obs), policy.unet
    with accelerated(policy):  # the defaults: the modules, as they are
        assert policy.unet is unet
        assert torch.equal(chunk_of(policy, obs), plain)

    fast = InferenceConfig(fast=True)
    with accelerated(policy, fast):
        assert isinstance(policy.unet, UnetPlan)
        assert dict(policy.named_children())["unet"] is unet  # a stand-in, not a submodule
        first = chunk_of(policy, obs)
    assert policy.unet is unet and torch.equal(chunk_of(policy, obs), plain)
    torch.testing.assert_close(first, plain, atol=FP32_ATOL, rtol=0)

    # An optimizer step between two evaluations: the next `with` runs the new weights.
    policy.train()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    policy(train_batch(config, 4))["loss"].backward()
    optimizer.step()
    policy.eval()
    with accelerated(policy, fast):
        after_step = chunk_of(policy, obs)
    assert not torch.allclose(after_step, first)
    torch.testing.assert_close(after_step, chunk_of(policy, obs), atol=FP32_ATOL, rtol=0)

    # Loading other weights (e.g. a checkpoint) into another policy: its `with` runs those.
    save_file(policy.state_dict(), tmp_path / "model.safetensors")
    other = _perturbed(DiffusionPolicy(replace(config), stats_for(config)))
    other.load_state_dict(load_file(tmp_path / "model.safetensors"))
    with accelerated(other, fast):
        torch.testing.assert_close(chunk_of(other, obs), after_step, atol=1e-4, rtol=0)

    # An error inside the `with` still gives the plain model back.
    with pytest.raises(RuntimeError, match="boom"), accelerated(policy, fast):
        raise RuntimeError("boom")
    assert policy.unet is unet
    # One layer at a time: a second one inside the first would build its plan from the first one's.
    inner = accelerated(policy, InferenceConfig(dtype="bfloat16"))
    with (
        accelerated(policy, fast),
        pytest.raises(RuntimeError, match="already inside an inference layer"),
        inner,
    ):
        pass
    assert policy.unet is unet and not {"unet", "sample_actions"} & vars(policy).keys()


def test_inference_options_leave_the_state_dict_alone():
    config = image_config()
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with accelerated(policy, InferenceConfig(fast=True, dtype="bfloat16")):
        policy.predict_action_chunk(obs_batch(config, 1))
        inside = policy.state_dict()
    for state in (inside, policy.state_dict()):
        assert state.keys() == before.keys()
        assert all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in before.items())
    assert all(p.dtype == torch.float32 for p in policy.parameters())


def _plan_tensors(policy: DiffusionPolicy) -> list[Tensor]:
    """Every tensor the plan standing in for the networks of `policy` holds (inside the fast path's `with`):
    parameters, buffers, prepacked weights, caches."""
    unet, encoder = policy.unet, policy.rgb_encoder if policy.image_keys else None
    modules = [*unet.modules()]
    if encoder is not None:
        modules += [*encoder.backbone.modules(), *encoder.pool.modules(), *encoder.out.modules()]
    tensors = [*unet._step_film.values()]
    for module in modules:
        tensors += [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        tensors += [value for value in vars(module).values() if isinstance(value, Tensor)]
    return tensors


@pytest.mark.parametrize("make_config", [image_config, keypoint_config])
def test_plan_lives_on_the_device_of_the_weights(make_config):
    """Built and run with another default device (`meta` stands in for a GPU), the plan of CPU weights
    puts nothing on the default device: every tensor follows the weights, and the chunk is still right."""
    config = make_config(inference_scheduler="DDIM", num_inference_steps=3)
    options = InferenceConfig(fast=True, dtype="bfloat16", int8_weights=True)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))
    obs = obs_batch(config, 1)
    expected = layer_chunk(policy, obs, **vars(options))
    torch.set_default_device("meta")
    try:
        with accelerated(policy, options):
            chunk = chunk_of(policy, obs)
            plan_tensors = _plan_tensors(policy)
    finally:
        torch.set_default_device(None)
    assert {t.device for t in plan_tensors} == {torch.device("cpu")}
    assert torch.equal(chunk, expected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(dtype="float16"), "inference.dtype='float16'"),
        (dict(compile=True), "compiles the fast path: set inference.fast=true"),
        (dict(int8_weights=True, dtype="bfloat16"), "fast-path option: set inference.fast=true"),
        (dict(int8_weights=True, fast=True), "int8_weights=true needs inference.dtype=bfloat16"),
    ],
)
def test_inference_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        InferenceConfig(**options).validate()
    overrides = [f"inference.{key}={str(value).lower()}" for key, value in options.items()]
    with pytest.raises(ConfigError, match=message):  # at start-up
        compose_config(["policy=diffusion", "env=pusht_keypoints", *overrides])


def test_inference_settings_are_a_section_of_the_run():
    """`inference.*` is the run's; the old `policy.inference.*` gets one line naming the new key, and a policy
    without an inference layer refuses settings other than the defaults."""
    cfg = compose_config(["policy=diffusion", "env=pusht_keypoints", "inference.fast=true"])
    assert OmegaConf.to_object(cfg.inference) == InferenceConfig(fast=True) and "inference" not in cfg.policy
    for old in (
        ["policy.inference.fast=true"],
        ["+policy.inference.fast=true", "policy.inference.compile=true"],
    ):
        with pytest.raises(ConfigError, match=r"write inference\.fast=true"):
            compose_config(["policy=diffusion", "env=pusht_keypoints", *old])
    # An evaluation's overrides merge into a (plain copy of a) checkpoint's config without Hydra: the same line.
    plain = OmegaConf.create(OmegaConf.to_container(cfg))
    override = OmegaConf.from_dotlist(["policy.inference.dtype=bfloat16"])
    with pytest.raises(ConfigError, match=r"write inference\.dtype=bfloat16$"):
        validate_run_config(OmegaConf.merge(plain, override))
    with pytest.raises(ConfigError, match="policy 'tdmpc' has no inference layer"):
        compose_config(["policy=tdmpc", "env=pendulum", "inference.fast=true"])


# The flat keys a run config held before `policy.inference` was a section, at their defaults.
OLD_INFERENCE_KEYS = dict(
    inference_dtype="float32",
    inference_fast_path=False,
    inference_compile=False,
    inference_int8_weights=False,
    inference_autocast=False,
)


@pytest.mark.parametrize(
    ("old_policy_keys", "expected"),
    [
        # The `policy.inference` section.
        (dict(inference=dict()), InferenceConfig()),
        (
            dict(inference=dict(fast=True, dtype="bfloat16", int8_weights=True, compile=False)),
            InferenceConfig(fast=True, dtype="bfloat16", int8_weights=True),
        ),
        # Before it, flat keys.
        (OLD_INFERENCE_KEYS, InferenceConfig()),
        ({**OLD_INFERENCE_KEYS, "inference_fast_path": True}, InferenceConfig(fast=True)),
        (
            {
                **OLD_INFERENCE_KEYS,
                "inference_fast_path": True,
                "inference_dtype": "bfloat16",
                "inference_int8_weights": True,
                "inference_compile": True,
            },
            InferenceConfig(fast=True, dtype="bfloat16", int8_weights=True, compile=True),
        ),
        ({**OLD_INFERENCE_KEYS, "inference_autocast": True}, InferenceConfig(dtype="bfloat16")),
    ],
)
def test_checkpoint_config_with_the_old_inference_keys_loads(tmp_path, old_policy_keys, expected):
    """A checkpoint's `config.yaml` written while the inference settings were the policy's (the
    `policy.inference` section, or before it flat `policy.inference_*` keys) loads, its settings moved to the
    top-level `inference` section."""
    cfg = OmegaConf.to_container(compose_config(["policy=diffusion", "env=pusht_keypoints"]))
    del cfg["inference"]
    cfg["policy"].update(old_policy_keys)
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "config.yaml")
    loaded = load_config(tmp_path)
    assert not {"inference", *OLD_INFERENCE_KEYS} & set(loaded.policy)
    assert OmegaConf.to_object(loaded.inference) == expected
    make_policy_config(loaded.policy, env_config(loaded))  # the policy section is today's


def test_compiled_fast_path_keeps_its_matmul_kernels(monkeypatch):
    """Compiled, the plan's matmuls still run `PreparedLinear.matmul` (int8 where the rows allow), once per
    layer per U-Net step, and the chunk is as close to fp32 as the eager plan's (not equal to it: inductor
    fuses the ops between the matmuls and rounds to bf16 once where eager rounds after every op), also at
    a second batch size (a graph with a dynamic batch, as refill evaluation needs). Compiling takes most
    of this test's time."""
    config = keypoint_config(down_dims=[32, 64], horizon=8, inference_scheduler="DDIM", num_inference_steps=2)
    policy = _perturbed(DiffusionPolicy(config, stats_for(config)))
    obs, obs_b3 = obs_batch(config, 1), obs_batch(config, 3)
    fp32, fp32_b3 = chunk_of(policy, obs), chunk_of(policy, obs_b3)
    options = dict(fast=True, dtype="bfloat16", int8_weights=True)
    eager, eager_b3 = layer_chunk(policy, obs, **options), layer_chunk(policy, obs_b3, **options)
    rows_seen: list[int] = []
    matmul = PreparedLinear.matmul

    def counted(self, x):
        rows_seen.append(x.shape[0])
        return matmul(self, x)

    monkeypatch.setattr(accel_diffusion.PreparedLinear, "matmul", counted)
    with accelerated(policy, InferenceConfig(**options, compile=True)):
        unet = policy.unet
        assert unet.compiled is not None
        compiled = chunk_of(policy, obs)
        rows_seen.clear()
        again = chunk_of(policy, obs)  # compiled already: no tracing, only the graph's calls
        layers = [m for m in unet.modules() if isinstance(m, PreparedLinear)]
        assert len(rows_seen) == 2 * len(layers)
        assert min(rows_seen) <= INT8_MAX_ROWS  # the deepest level reads its int8 weights
        assert torch.equal(compiled, again)
        error, eager_error = (compiled - fp32).abs().mean(), (eager - fp32).abs().mean()
        assert error < 1.5 * eager_error + 0.1, (error, eager_error)  # actions in [0, 512]
        chunk_of(
            policy, obs_batch(config, 2)
        )  # compiles the graph with a dynamic batch, which serves batch 3
        rows_seen.clear()
        compiled_b3 = chunk_of(policy, obs_b3)
    assert len(rows_seen) == 2 * len(layers) and min(rows_seen) > INT8_MAX_ROWS
    error, eager_error = (compiled_b3 - fp32_b3).abs().mean(), (eager_b3 - fp32_b3).abs().mean()
    assert error < 1.5 * eager_error + 0.1, (error, eager_error)
