"""Image encoder of Diffusion Policy: crop -> ResNet (GroupNorm) -> spatial softmax -> linear.

Chi et al. 2023 train a ResNet-18 from scratch, replace BatchNorm with GroupNorm (BatchNorm interacts badly
with the EMA of the weights) and its global average pooling with a spatial softmax, which keeps *where*
features fire: each of K learned keypoint maps becomes its expected (x, y) image coordinate.

In training the crops are random, one offset per image; the offsets are among the policy's per-sample draws
(`DiffusionPolicy.draw_training_noise`), which the trainer may make and hand to `forward` in the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import einops
import torch
import torchvision
from torch import Tensor, nn

from lerobot.policies.images import resize

if TYPE_CHECKING:
    from lerobot.policies.diffusion.configuration import DiffusionConfig


class SpatialSoftmax(nn.Module):
    """Feature map `(N, C, H, W)` -> expected keypoint coordinates `(N, K, 2)` in `[-1, 1]`.

    A 1x1 convolution projects the C channels onto K keypoint maps; a softmax over the H*W positions of each
    map gives a distribution whose mean position (x, y) is the keypoint. The mean is one matmul with the
    fixed coordinate grid.
    """

    def __init__(self, in_shape: tuple[int, int, int], num_keypoints: int):
        super().__init__()
        channels, height, width = in_shape
        self.num_keypoints = num_keypoints
        self.keypoint_proj = nn.Conv2d(channels, num_keypoints, kernel_size=1)
        ys, xs = torch.meshgrid(
            torch.linspace(-1.0, 1.0, height), torch.linspace(-1.0, 1.0, width), indexing="ij"
        )
        # Not persistent: it is a function of the shape, not a learned or data-derived value.
        self.register_buffer(
            "grid", torch.stack([xs, ys], dim=-1).reshape(height * width, 2), persistent=False
        )

    def forward(self, features: Tensor) -> Tensor:
        """`features` (N, C, H, W) -> keypoints (N, K, 2) as (x, y)."""
        maps = einops.rearrange(self.keypoint_proj(features), "n k h w -> n k (h w)")
        attention = torch.softmax(maps, dim=-1)
        return attention @ self.grid.to(attention.dtype)


def _group_norm_like(batch_norm: nn.BatchNorm2d) -> nn.GroupNorm:
    # 16 channels per group, as the paper (64 channels -> 4 groups ... 512 -> 32 groups).
    channels = batch_norm.num_features
    return nn.GroupNorm(num_groups=max(1, channels // 16), num_channels=channels)


def replace_batch_norm(module: nn.Module) -> nn.Module:
    """Replace every `BatchNorm2d` inside `module` by a `GroupNorm` with 16 channels per group (in place)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, _group_norm_like(child))
        else:
            replace_batch_norm(child)
    return module


class _Conv2dWeightGradFp32(torch.autograd.Function):
    """A 2-D convolution in a low-precision dtype whose weight gradient is computed in fp32.

    On CPU, PyTorch's bf16 convolution weight gradient is much slower than fp32's, which made bf16
    autocast training of the image policy slower than fp32; the forward pass and the input gradient are
    fast in bf16 and stay there.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, dtype, stride, padding, dilation, groups):
        low_weight = weight.to(dtype)
        # The fp32 weight too: the weight gradient's convolution takes a weight of its dtype (only its shape
        # counts there), which casting the low-precision copy back would cost a copy per step.
        ctx.save_for_backward(x, weight, low_weight)
        ctx.conv = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        return nn.functional.conv2d(x, low_weight, bias.to(dtype) if bias is not None else None, *ctx.conv)

    @staticmethod
    def backward(ctx, grad):
        x, weight, low_weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        grad_x = grad_w = grad_b = None
        conv_args = (stride, padding, dilation, False, (0, 0), groups)
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, low_weight, None, *conv_args, (True, False, False)
            )[0]
        if ctx.needs_input_grad[1]:
            grad_w = torch.ops.aten.convolution_backward(
                grad.float(), x.float(), weight, None, *conv_args, (False, True, False)
            )[1]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.float().sum(dim=(0, 2, 3))
        return grad_x, grad_w, grad_b, None, None, None, None, None


class AutocastFriendlyConv2d(nn.Conv2d):
    """`nn.Conv2d` (same parameters) whose weight gradient stays fp32 when training under CPU autocast.

    Outside that case (no autocast, no gradient, or not on CPU) it is exactly `nn.Conv2d`.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (
            x.device.type == "cpu"
            and torch.is_grad_enabled()
            and torch.is_autocast_enabled("cpu")
            and self.padding_mode == "zeros"
            and not isinstance(self.padding, str)
        ):
            return super().forward(x)
        dtype = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return _Conv2dWeightGradFp32.apply(
                x.to(dtype),
                self.weight,
                self.bias,
                dtype,
                self.stride,
                self.padding,
                self.dilation,
                self.groups,
            )


def use_autocast_friendly_convs(module: nn.Module) -> nn.Module:
    """Turn every plain `nn.Conv2d` inside `module` into an `AutocastFriendlyConv2d` (in place; the
    parameters, their names and the state dict do not change)."""
    for child in module.modules():
        if type(child) is nn.Conv2d:
            child.__class__ = AutocastFriendlyConv2d
    return module


def draw_crop_offsets(
    n: int, image_size: tuple[int, int], size: tuple[int, int], generator: torch.Generator | None = None
) -> Tensor:
    """Random top-left corners `(n, 2)`, as (top, left), of `size` (h, w) crops of `image_size` (H, W) images.

    All the tops are drawn, then all the lefts, on the CPU stream (or the generator's device): the same
    offsets whatever device trains, resumed exactly from a checkpoint's CPU random state.
    """
    height, width = image_size
    h, w = size
    device = generator.device if generator is not None else "cpu"
    top = torch.randint(0, height - h + 1, (n,), generator=generator, device=device)
    left = torch.randint(0, width - w + 1, (n,), generator=generator, device=device)
    return torch.stack([top, left], dim=-1)


def random_crop(
    images: Tensor,
    size: tuple[int, int],
    generator: torch.Generator | None = None,
    offsets: Tensor | None = None,
) -> Tensor:
    """Crop every image of `images` (N, C, H, W) at its own random offset to `(N, C, h, w)`.

    `offsets` (N, 2) are the crops' top-left corners (`draw_crop_offsets`); None: drawn here, from
    `generator` when given.
    """
    n, _, height, width = images.shape
    h, w = size
    if offsets is None:
        offsets = draw_crop_offsets(n, (height, width), size, generator)
    # The (N, 2) copy to the images' device does not wait for the device.
    offsets = offsets.to(images.device, non_blocking=True)
    top, left = offsets[:, 0], offsets[:, 1]
    rows = top[:, None] + torch.arange(h, device=images.device)  # (N, h)
    cols = left[:, None] + torch.arange(w, device=images.device)  # (N, w)
    samples = torch.arange(n, device=images.device)
    # Per-sample advanced indexing on a channels-last view: one copy, no Python loop over samples. The
    # result is (N, h, w, C) in memory, i.e. a channels_last (N, C, h, w) tensor, which convolutions accept.
    pixels = einops.rearrange(images, "n c h w -> n h w c")
    crops = pixels[samples[:, None, None], rows[:, :, None], cols[:, None, :]]  # (N, h, w, C)
    return einops.rearrange(crops, "n h w c -> n c h w")


def center_crop(images: Tensor, size: tuple[int, int]) -> Tensor:
    """Crop the center `(h, w)` of `images` (N, C, H, W)."""
    height, width = images.shape[-2:]
    top, left = (height - size[0]) // 2, (width - size[1]) // 2
    return images[..., top : top + size[0], left : left + size[1]]


class RgbEncoder(nn.Module):
    """Images `(N, C, H, W)` (normalized) -> features `(N, feature_dim)`, `feature_dim = 2 * num_keypoints`.

    Crops randomly in training mode (if `crop_is_random`) and centrally in eval mode. The random crops'
    offsets can be given to `forward` (drawn beforehand with `draw_crop_offsets`); otherwise they are drawn
    there.
    """

    def __init__(self, config: DiffusionConfig):
        super().__init__()
        (image_shape,) = {tuple(s) for s in config.image_features.values()}
        channels, height, width = image_shape
        self.resize_shape = tuple(config.resize_shape) if config.resize_shape is not None else None
        self.crop_shape = tuple(config.crop_shape) if config.crop_shape is not None else None
        self.crop_is_random = config.crop_is_random
        # The size images have when they reach the crop.
        self.crop_input_shape = self.resize_shape or (height, width)

        resnet = torchvision.models.get_model(
            config.vision_backbone, weights=config.pretrained_backbone_weights
        )
        if channels != 3:
            resnet.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        # The stem (conv, norm, ReLU, max pool) and the first `vision_backbone_stages` residual stages; global
        # average pooling and the classifier go in any case.
        stem_and_stages = list(resnet.children())[: 4 + config.vision_backbone_stages]
        self.backbone = nn.Sequential(*stem_and_stages)
        if config.use_group_norm:
            replace_batch_norm(self.backbone)

        # The feature map's shape depends on the (cropped) input size; find it with one tiny forward pass.
        in_hw = self.crop_shape or self.resize_shape or (height, width)
        with torch.no_grad():
            feature_shape = self.backbone(torch.zeros(1, channels, *in_hw)).shape[1:]
        self.pool = SpatialSoftmax(tuple(feature_shape), config.spatial_softmax_num_keypoints)
        self.feature_dim = 2 * config.spatial_softmax_num_keypoints
        self.out = nn.Sequential(nn.Linear(self.feature_dim, self.feature_dim), nn.ReLU())
        use_autocast_friendly_convs(self)

    def draw_crop_offsets(self, n: int) -> Tensor | None:
        """The offsets `(n, 2)` of the random crops of `n` images in a `forward` pass, drawn from the global
        random stream as `forward` draws them; None when this encoder does not crop randomly in its current
        mode (evaluation, no crop, `crop_is_random` off, or a crop the size of the image)."""
        if not (
            self.training
            and self.crop_is_random
            and self.crop_shape is not None
            and self.crop_input_shape != self.crop_shape
        ):
            return None
        return draw_crop_offsets(n, self.crop_input_shape, self.crop_shape)

    def forward(self, images: Tensor, crop_offsets: Tensor | None = None) -> Tensor:
        """`images` (N, C, H, W) -> `(N, feature_dim)`.

        `crop_offsets` (N, 2): the random crops' top-left corners (`draw_crop_offsets`), read in training
        mode; None: drawn here.
        """
        images = resize(images, self.resize_shape)
        if self.crop_shape is not None and images.shape[-2:] != self.crop_shape:
            if self.training and self.crop_is_random:
                images = random_crop(images, self.crop_shape, offsets=crop_offsets)
            else:
                images = center_crop(images, self.crop_shape)
        keypoints = self.pool(self.backbone(images))  # (N, K, 2)
        return self.out(einops.rearrange(keypoints, "n k xy -> n (k xy)"))
