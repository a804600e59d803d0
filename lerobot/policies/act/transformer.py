"""ACT's transformer (DETR's encoder and decoder layers) and its position embeddings.

The layers compute what LeRobot's `ACTEncoderLayer` / `ACTDecoderLayer` compute, under the same module names
(so a LeRobot ACT state dict maps onto them name for name); in training on the CPU their dropout masks come
from 16 random bits per element (`cpu_dropout`), cheaper than torch's Bernoulli draw per element.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import einops
import torch
from torch import Tensor, nn
from torch.nn import functional as F  # noqa: N812

from lerobot.policies.act.configuration import ACTConfig

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


# ---------------------------------------------------------------------------------- position embeddings
def sinusoidal_embedding_1d(num_positions: int, dim: int) -> Tensor:
    """Fixed positions `(num_positions, dim)` float32 as in "Attention Is All You Need": position p, channel j
    is `sin(p / 10000^(2 floor(j/2) / dim))` for even j and `cos(...)` for odd j (computed in float64)."""
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
    exponents = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
    angles = positions / torch.pow(10000.0, exponents)
    even = torch.arange(dim) % 2 == 0
    return torch.where(even, torch.sin(angles), torch.cos(angles)).float()


class SinusoidalPositionEmbedding2d(nn.Module):
    """Fixed 2-D positions of a feature map (DETR's): `(N, C, H, W)` -> `(1, 2 * dim, H, W)`.

    The first `dim` channels encode the row, the last `dim` the column, each as interleaved sines (even
    channels) and cosines (odd channels) of the position scaled to `(0, 2 pi]`: row i (1-based) of H is at
    `2 pi i / H`, with the frequencies of `sinusoidal_embedding_1d`. The arithmetic is LeRobot's (float32,
    the same operations), so loaded LeRobot weights see the same embedding.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, features: Tensor) -> Tensor:
        """`features` (N, C, H, W) (only its size and device are read) -> `(1, 2 * dim, H, W)` float32."""
        height, width = features.shape[-2:]
        device = features.device
        eps, two_pi = 1e-6, 2 * math.pi
        rows = torch.arange(1, height + 1, dtype=torch.float32, device=device)
        cols = torch.arange(1, width + 1, dtype=torch.float32, device=device)
        rows = rows / (rows[-1] + eps) * two_pi
        cols = cols / (cols[-1] + eps) * two_pi
        channel = torch.arange(self.dim, dtype=torch.float32, device=device)
        frequency = 10000 ** (2 * (channel // 2) / self.dim)  # (dim,), equal in pairs
        even = torch.arange(self.dim, device=device) % 2 == 0
        row_angles = rows[:, None] / frequency  # (H, dim)
        col_angles = cols[:, None] / frequency  # (W, dim)
        row_embed = torch.where(even, row_angles.sin(), row_angles.cos())
        col_embed = torch.where(even, col_angles.sin(), col_angles.cos())
        embed = torch.cat(
            [
                einops.repeat(row_embed, "h c -> c h w", w=width),
                einops.repeat(col_embed, "w c -> c h w", h=height),
            ],
            dim=0,
        )
        return embed[None]


# ---------------------------------------------------------------------------------- transformer
# Dropout masks from 16 random bits per element: four elements per 64-bit draw.
_MASK_BITS = 16


def cpu_dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of `x` (any shape) with a mask of 16 random bits per element from the global
    torch stream (four elements per 64-bit draw), for 0 < `p` < 1: an element is dropped with probability
    round(p * 2^16) / 2^16 (within 8e-6 of `p`) and kept ones are scaled so that the expectation equals the
    input. On the CPU torch draws one Bernoulli variate per element, the costliest part of the layer."""
    levels = 1 << _MASK_BITS
    dropped = round(p * levels)  # of the `levels` values a 16-bit lane takes
    n = x.numel()
    bits = torch.empty(-(-n * _MASK_BITS // 64), dtype=torch.int64).random_(-(2**63), None)
    keep = bits.view(torch.int16)[:n].view(x.shape) >= dropped - levels // 2
    return x * keep.to(x.dtype).mul_(levels / (levels - dropped))


class Dropout(nn.Dropout):
    """`nn.Dropout` with `cpu_dropout`'s cheaper mask in training on the CPU; elsewhere, and for p = 0 or 1,
    it is `nn.Dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        """`x` (any shape) with dropped elements zeroed and kept ones scaled, in training mode."""
        if not self.training or self.p in (0.0, 1.0) or x.device.type != "cpu":
            return super().forward(x)
        return cpu_dropout(x, self.p)


class MultiheadAttention(nn.MultiheadAttention):
    """`nn.MultiheadAttention` (batch first, same parameters and state-dict names) whose attention-weight
    dropout, in training on the CPU, is `cpu_dropout`: torch's kernel draws a Bernoulli
    variate per weight there and guards every softmax row against being fully masked, which together cost
    more than the attention's matrix products at ACT's sizes. Elsewhere, and without dropout, it is
    `nn.MultiheadAttention`. Here a query whose keys are all masked (never the case in ACT: the cls token is
    always a key) gets NaN, where torch's kernel gives zeros."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, None]:
        """`query` (B, T, D), `key` and `value` (B, S, D), `key_padding_mask` (B, S) True at ignored keys
        -> (`(B, T, D)`, None)."""
        if need_weights or not self.training or self.dropout in (0.0, 1.0) or query.device.type != "cpu":
            return super().forward(
                query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights
            )
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        heads = "b t (h d) -> b h t d"
        q = einops.rearrange(F.linear(query, w_q, b_q), heads, h=self.num_heads)
        k = einops.rearrange(F.linear(key, w_k, b_k), heads, h=self.num_heads)
        v = einops.rearrange(F.linear(value, w_v, b_v), heads, h=self.num_heads)
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)  # (B, H, T, S)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = cpu_dropout(scores.softmax(dim=-1), self.dropout)
        attended = einops.rearrange(weights @ v, "b h t d -> b t (h d)")
        return self.out_proj(attended), None


class _TransformerLayer(nn.Module):
    """What DETR's encoder and decoder layers share: self-attention (and, in the decoder, cross-attention to
    the encoder's memory), a feed-forward block, and a LayerNorm and a dropout per sub-layer (`norm<i>`,
    `dropout<i>`).

    The modules are created in the order (and under the names) of LeRobot's layers: a seed then gives the
    same initial weights, and a LeRobot state dict loads name for name."""

    def __init__(self, config: ACTConfig, cross_attention: bool):
        super().__init__()
        dim = config.dim_model
        self.self_attn = MultiheadAttention(dim, config.n_heads, dropout=config.dropout, batch_first=True)
        if cross_attention:
            self.multihead_attn = MultiheadAttention(
                dim, config.n_heads, dropout=config.dropout, batch_first=True
            )
        self.linear1 = nn.Linear(dim, config.dim_feedforward)
        self.dropout = Dropout(config.dropout)
        self.linear2 = nn.Linear(config.dim_feedforward, dim)
        sublayers = range(1, 4 if cross_attention else 3)
        for i in sublayers:
            self.add_module(f"norm{i}", nn.LayerNorm(dim))
        for i in sublayers:
            self.add_module(f"dropout{i}", Dropout(config.dropout))
        self.activation = _ACTIVATIONS[config.feedforward_activation]
        self.pre_norm = config.pre_norm

    def _feedforward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class ACTEncoderLayer(_TransformerLayer):
    """Self-attention + feed-forward block (DETR's), post-norm or pre-norm; tokens `(B, S, D)`.

    Position embeddings are added to the queries and keys only, never to the values."""

    def __init__(self, config: ACTConfig):
        super().__init__(config, cross_attention=False)

    def forward(self, x: Tensor, pos: Tensor | None = None, key_padding_mask: Tensor | None = None) -> Tensor:
        """`x` (B, S, D), `pos` broadcastable to it, `key_padding_mask` (B, S) True at ignored tokens."""
        h = self.norm1(x) if self.pre_norm else x
        qk = h if pos is None else h + pos
        attended = self.self_attn(qk, qk, h, key_padding_mask=key_padding_mask, need_weights=False)[0]
        x = x + self.dropout1(attended)
        if self.pre_norm:
            return x + self.dropout2(self._feedforward(self.norm2(x)))
        x = self.norm1(x)
        return self.norm2(x + self.dropout2(self._feedforward(x)))


class ACTEncoder(nn.Module):
    """A stack of `ACTEncoderLayer`s, followed by a LayerNorm with pre-norm (identity with post-norm)."""

    def __init__(self, config: ACTConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([ACTEncoderLayer(config) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(config.dim_model) if config.pre_norm else nn.Identity()

    def forward(self, x: Tensor, pos: Tensor | None = None, key_padding_mask: Tensor | None = None) -> Tensor:
        """`x` (B, S, D) -> (B, S, D)."""
        for layer in self.layers:
            x = layer(x, pos=pos, key_padding_mask=key_padding_mask)
        return self.norm(x)


class ACTDecoderLayer(_TransformerLayer):
    """Self-attention, cross-attention to the encoder's memory, feed-forward (DETR's decoder layer).

    The query positions are added to the queries (and self-attention keys), the memory positions to the
    cross-attention keys."""

    def __init__(self, config: ACTConfig):
        super().__init__(config, cross_attention=True)

    def forward(self, x: Tensor, memory: Tensor, query_pos: Tensor, memory_pos: Tensor) -> Tensor:
        """Queries `x` (B, T, D), `memory` (B, S, D), positions broadcastable to them -> (B, T, D)."""
        h = self.norm1(x) if self.pre_norm else x
        qk = h + query_pos
        x = x + self.dropout1(self.self_attn(qk, qk, h, need_weights=False)[0])
        if not self.pre_norm:
            x = self.norm1(x)
        h = self.norm2(x) if self.pre_norm else x
        attended = self.multihead_attn(h + query_pos, memory + memory_pos, memory, need_weights=False)[0]
        x = x + self.dropout2(attended)
        if not self.pre_norm:
            x = self.norm2(x)
        h = self.norm3(x) if self.pre_norm else x
        x = x + self.dropout3(self._feedforward(h))
        return x if self.pre_norm else self.norm3(x)


class ACTDecoder(nn.Module):
    """A stack of `ACTDecoderLayer`s followed by a LayerNorm (always, as DETR)."""

    def __init__(self, config: ACTConfig):
        super().__init__()
        self.layers = nn.ModuleList([ACTDecoderLayer(config) for _ in range(config.n_decoder_layers)])
        self.norm = nn.LayerNorm(config.dim_model)

    def forward(self, x: Tensor, memory: Tensor, query_pos: Tensor, memory_pos: Tensor) -> Tensor:
        """Queries `x` (B, T, D) attending to `memory` (B, S, D) -> (B, T, D)."""
        for layer in self.layers:
            x = layer(x, memory, query_pos=query_pos, memory_pos=memory_pos)
        return self.norm(x)
