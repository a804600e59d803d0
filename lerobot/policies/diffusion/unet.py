"""1-D temporal U-Net of Diffusion Policy (Chi et al. 2023, the CNN variant).

The U-Net denoises an action sequence `(B, T, A)`; convolutions run along time with the action dimensions
as channels. Every residual block is conditioned by FiLM on `cond = [diffusion-step embedding, global
observation features]`: a linear map of `cond` gives a per-channel scale and bias applied between the
block's two convolutions.

Layout (down_dims = [d1, d2, d3]; time length T, T/2, T/4):

    in (A, T) -> [Res(A, d1), Res(d1, d1), Down] -> [Res(d1, d2), Res(d2, d2), Down] -> [Res(d2, d3), Res(d3, d3)]
              -> mid [Res(d3, d3), Res(d3, d3)]
              -> cat skip(d3, T/4) -> [Res(2*d3, d2), Res(d2, d2), Up]
              -> cat skip(d2, T/2) -> [Res(2*d2, d1), Res(d1, d1), Up] -> Conv(d1, d1) -> 1x1 -> out (A, T)

Skip connections concatenate a down level's output (before its downsampling) with the up path at the same
time resolution. Every convolution is one matmul: `TemporalConv1d`, and `TemporalUpsample1d` for the two
transposed ones that double the time axis (same parameters as `nn.Conv1d` / `nn.ConvTranspose1d`);
GroupNorm and Mish are elementwise.
"""

from __future__ import annotations

import math

import einops
import torch
from torch import Tensor, nn


class SinusoidalStepEmbedding(nn.Module):
    """Diffusion step `(B,)` -> `(B, dim)`: sines and cosines at geometrically spaced frequencies."""

    def __init__(self, dim: int):
        super().__init__()
        half = dim // 2
        # Frequencies from 1 down to 1/10000, as the Transformer's position encoding.
        freqs = torch.exp(-math.log(10_000) * torch.arange(half) / max(half - 1, 1))
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, steps: Tensor) -> Tensor:
        """`steps` (B,) integer or float -> embedding (B, dim)."""
        angles = steps.float()[:, None] * self.freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TemporalConv1d(nn.Linear):
    """A 1-D convolution over time `(B, C_in, T)` -> `(B, C_out, T_out)`, computed as one matmul.

    The U-Net's sequences are short (T = 16, 8, 4) and its channels wide (up to 2048): a direct convolution
    kernel runs far below the CPU's matmul throughput there. Unfolding the k taps of every output position
    into the channel axis turns the convolution into `(B*T_out, C_in*k) @ (C_in*k, C_out)`, a linear layer,
    which takes the BLAS / oneDNN matmul path (AMX under bf16 autocast).

    `weight` is `(C_out, C_in * k)`, column `c * k + j` holding tap j of input channel c: `nn.Conv1d`'s
    weight reshaped, with the same initialization (both use fan_in = C_in * k). Keeping the parameter 2-D,
    rather than reshaping a 3-D one in `forward`, lets autocast cache its bf16 copy across denoising steps
    (autocast caches casts of leaf parameters only, not of views).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0
    ):
        super().__init__(in_channels * kernel_size, out_channels)
        self.in_channels = in_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def forward(self, x: Tensor) -> Tensor:
        """`x` (B, C_in, T) -> (B, C_out, (T + 2 * padding - kernel_size) // stride + 1)."""
        windows = nn.functional.pad(x, (self.padding, self.padding)).unfold(2, self.kernel_size, self.stride)
        columns = einops.rearrange(windows, "b c t k -> (b t) (c k)")  # (B*T_out, C_in*k)
        return einops.rearrange(super().forward(columns), "(b t) o -> b o t", b=x.shape[0])


def interleave_upsample_taps(taps: Tensor, bias: Tensor | None) -> Tensor:
    """Finish `ConvTranspose1d(C_in, C_out, 4, stride=2, padding=1)` from per-tap products.

    `taps` (B, T, C_out, 4) holds `x[i] @ W_j` for every input step i and tap j (one matmul of the
    time-major input with the weight viewed as `(C_in, C_out * 4)`). Output step o receives input step i
    through tap j = o + 1 - 2i, so output 2m = x[m-1] W3 + x[m] W1 and output 2m+1 = x[m] W2 + x[m+1] W0.
    Returns the time-major output (B, 2T, C_out).
    """
    padded = nn.functional.pad(taps, (0, 0, 0, 0, 1, 1))  # zero steps -1 and T
    even = padded[:, :-2, :, 3] + padded[:, 1:-1, :, 1]
    odd = padded[:, 1:-1, :, 2] + padded[:, 2:, :, 0]
    out = torch.stack([even, odd], dim=2).flatten(1, 2)  # (B, 2T, C_out), steps 2m, 2m+1 interleaved
    return out if bias is None else out + bias.to(out.dtype)


class TemporalUpsample1d(nn.ConvTranspose1d):
    """`nn.ConvTranspose1d(C, C, 4, stride=2, padding=1)` `(B, C, T)` -> `(B, C, 2T)` as one matmul.

    Same parameters (and state dict) as the transposed convolution; the weight `(C_in, C_out, 4)` is used
    as the free view `(C_in, C_out * 4)`, so no per-call weight rearrangement (see
    `interleave_upsample_taps`). Besides running on the matmul kernels, this avoids the CPU's
    transposed-convolution backward, which is pathologically slow in bf16.
    """

    def __init__(self, channels: int):
        super().__init__(channels, channels, kernel_size=4, stride=2, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        batch, _, length = x.shape
        taps = torch.matmul(x.transpose(1, 2), self.weight.view(self.in_channels, -1))  # (B, T, C_out*4)
        out = interleave_upsample_taps(taps.view(batch, length, self.out_channels, 4), self.bias)
        return out.transpose(1, 2)


class ConvNormMish(nn.Sequential):
    """`(B, C_in, T)` -> `(B, C_out, T)`: same-length Conv1d, GroupNorm, Mish."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, n_groups: int):
        super().__init__(
            TemporalConv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )


class FiLMResidualBlock(nn.Module):
    """Residual block `(B, C_in, T)` -> `(B, C_out, T)` with FiLM conditioning on `cond` `(B, cond_dim)`.

    out = conv2(scale(cond) * conv1(x) + bias(cond)) + skip(x); with `use_scale=False` only the bias is used.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        cond_dim: int,
        kernel_size: int,
        n_groups: int,
        use_scale: bool = True,
    ):
        super().__init__()
        self.out_channels = out_channels
        self.use_scale = use_scale
        self.conv1 = ConvNormMish(in_channels, out_channels, kernel_size, n_groups)
        self.conv2 = ConvNormMish(out_channels, out_channels, kernel_size, n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, out_channels * (2 if use_scale else 1)))
        # A 1x1 convolution matches the channel count of the skip path when it changes.
        self.skip = (
            TemporalConv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        )

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        """`x` (B, C_in, T), `cond` (B, cond_dim) -> (B, C_out, T)."""
        h = self.conv1(x)
        film = einops.rearrange(self.film(cond), "b c -> b c 1")
        if self.use_scale:
            scale, bias = film.chunk(2, dim=1)
            h = scale * h + bias
        else:
            h = h + film
        return self.conv2(h) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """Noise (or sample) prediction network `(B, T, A), step (B,), global_cond (B, G)` -> `(B, T, A)`.

    Args:
        action_dim: A, channels of the input and output sequence.
        global_cond_dim: G, size of the flattened observation features.
        down_dims: channel widths of the levels; the time axis is halved between levels, so T must be
            divisible by `2 ** (len(down_dims) - 1)`.
        kernel_size, n_groups: convolution kernel (odd) and GroupNorm groups.
        step_embed_dim: size of the diffusion-step embedding.
        use_film_scale: FiLM with scale and bias (True) or bias only.
    """

    def __init__(
        self,
        action_dim: int,
        global_cond_dim: int,
        down_dims: list[int],
        kernel_size: int = 5,
        n_groups: int = 8,
        step_embed_dim: int = 128,
        use_film_scale: bool = True,
    ):
        super().__init__()
        self.step_encoder = nn.Sequential(
            SinusoidalStepEmbedding(step_embed_dim),
            nn.Linear(step_embed_dim, step_embed_dim * 4),
            nn.Mish(),
            nn.Linear(step_embed_dim * 4, step_embed_dim),
        )
        cond_dim = step_embed_dim + global_cond_dim

        def block(c_in: int, c_out: int) -> FiLMResidualBlock:
            return FiLMResidualBlock(c_in, c_out, cond_dim, kernel_size, n_groups, use_film_scale)

        widths = [action_dim, *down_dims]
        levels = list(zip(widths[:-1], widths[1:], strict=True))  # (c_in, c_out) per level
        self.down = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(levels):
            is_last = i == len(levels) - 1
            self.down.append(
                nn.ModuleList(
                    [
                        block(c_in, c_out),
                        block(c_out, c_out),
                        # Halve the time axis (strided conv) between levels.
                        nn.Identity() if is_last else TemporalConv1d(c_out, c_out, 3, stride=2, padding=1),
                    ]
                )
            )
        self.mid = nn.ModuleList([block(down_dims[-1], down_dims[-1]), block(down_dims[-1], down_dims[-1])])
        self.up = nn.ModuleList()
        # Going up, each level takes its input concatenated with the matching down level's output.
        # Every up level doubles the time axis back, so the output has the input's length; the top level's
        # output (full length, d1 channels) is not concatenated again, as in the paper's network.
        for c_in, c_out in reversed(levels[1:]):
            self.up.append(
                nn.ModuleList(
                    [
                        block(2 * c_out, c_in),
                        block(c_in, c_in),
                        TemporalUpsample1d(c_in),
                    ]
                )
            )
        self.final = nn.Sequential(
            ConvNormMish(down_dims[0], down_dims[0], kernel_size, n_groups),
            TemporalConv1d(down_dims[0], action_dim, 1),
        )

    def forward(self, sample: Tensor, step: Tensor, global_cond: Tensor) -> Tensor:
        """`sample` (B, T, A), `step` (B,) diffusion steps, `global_cond` (B, G) -> prediction (B, T, A)."""
        cond = torch.cat([self.step_encoder(step).to(global_cond.dtype), global_cond], dim=-1)
        x = einops.rearrange(sample, "b t a -> b a t")
        skips = []  # outputs of the levels below the top one, deepest last
        for i, (res1, res2, downsample) in enumerate(self.down):
            x = res2(res1(x, cond), cond)
            if i > 0:
                skips.append(x)
            x = downsample(x)
        for res in self.mid:
            x = res(x, cond)
        for res1, res2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(res2(res1(x, cond), cond))
        return einops.rearrange(self.final(x), "b a t -> b t a")

    def condition(self, global_cond: Tensor, timesteps: Tensor) -> tuple[Tensor, Tensor]:
        """What the denoising steps of one chunk share: here `(global_cond, timesteps)` as given, since the
        network computes everything per step (an inference form of it may precompute parts here)."""
        return global_cond, timesteps

    def denoise(self, sample: Tensor, conditioning: tuple[Tensor, Tensor], index: int) -> Tensor:
        """The prediction for `sample` (B, T, A) at the `index`-th timestep of `condition()`."""
        global_cond, timesteps = conditioning
        steps = torch.full((sample.shape[0],), int(timesteps[index]), device=sample.device, dtype=torch.long)
        return self(sample, steps, global_cond)
