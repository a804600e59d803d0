"""SAC's networks: the tanh-squashed Gaussian actor, a vectorised Q ensemble, the DrQ pixel encoder and its random
shift.

Everything works on normalised quantities: state inputs and actions in [-1, 1], images in [-0.5, 0.5].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from lerobot.policies.sac.configuration import conv_output_size

# Bounds of the actor's log-std, as Stable-Baselines3 (and the authors' softlearning) clip it.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def mlp(in_dim: int, hidden_dims: list[int], out_dim: int) -> nn.Sequential:
    """Linear -> ReLU for each hidden layer, then a Linear: (..., in_dim) -> (..., out_dim)."""
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden_dims]
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], out_dim))
    return nn.Sequential(*layers)


def tanh_gaussian_log_prob(u: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """log pi(tanh(u)) of the Gaussian N(mean, exp(log_std)) squashed by tanh, summed over the last dim:
    (..., A) -> (...).

    The change of variables subtracts log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) per dimension, written
    this way because 1 - tanh(u)^2 underflows to 0 for |u| beyond about 9 in float32.
    """
    return _log_prob((u - mean) * torch.exp(-log_std), u, log_std)


def _log_prob(z: Tensor, u: Tensor, log_std: Tensor) -> Tensor:
    """`tanh_gaussian_log_prob` from the standardised draw z = (u - mean) / std: (..., A) -> (...)."""
    log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (-0.5 * z.square() - log_std - log_det).sum(dim=-1) - u.shape[-1] * _HALF_LOG_2PI


class TanhGaussianActor(nn.Module):
    """pi(a | x): an MLP giving the mean and log-std of a Gaussian over u, and a = tanh(u) in [-1, 1]^A."""

    def __init__(self, in_dim: int, hidden_dims: list[int], action_dim: int):
        super().__init__()
        self.net = mlp(in_dim, hidden_dims, 2 * action_dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and clipped log-std of the pre-tanh Gaussian, each (..., A), from features x (..., in_dim); in
        float32 under autocast too, so that the log-density does not lose its precision to bf16."""
        mean, log_std = self.net(x).float().chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, x: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterised draw a = tanh(mean + std * eps) (..., A) and its log-density log pi(a | x) (...),
        with eps (..., A) standard normal noise."""
        mean, log_std = self(x)
        u = mean + log_std.exp() * eps
        # (u - mean) / std is eps itself: the log-density reads it rather than recomputing it.
        return torch.tanh(u), _log_prob(eps, u, log_std)

    def draw(self, x: Tensor, eps: Tensor) -> Tensor:
        """The action of `sample` alone, without its log-density (acting needs none)."""
        mean, log_std = self(x)
        return torch.tanh(mean + log_std.exp() * eps)

    def mode(self, x: Tensor) -> Tensor:
        """The deterministic action tanh(mean) (..., A), for evaluation."""
        return torch.tanh(self(x)[0])


class EnsembleMLP(nn.Module):
    """`n` independent ReLU MLPs evaluated in one batched matmul per layer: (..., in_dim) -> (n, ..., out_dim).

    Weights are initialised as `nn.Linear`'s, so each member is a freshly built `mlp`. `detach_params=True`
    evaluates the members with their weights cut from the graph: gradients reach the inputs only (SAC's actor
    loss differentiates through the action into the actor, never into the critics).
    """

    def __init__(self, n: int, in_dim: int, hidden_dims: list[int], out_dim: int):
        super().__init__()
        dims = [in_dim, *hidden_dims, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default init, weights and biases
            self.weights.append(nn.Parameter(torch.empty(n, d_in, d_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, d_out).uniform_(-bound, bound)))
        self.n = n

    def forward(self, x: Tensor, detach_params: bool = False) -> Tensor:
        lead = x.shape[:-1]
        h = rearrange(x, "... d -> 1 (...) d").expand(self.n, -1, -1)  # (n, N, in_dim)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach_params:
                w, b = w.detach(), b.detach()
            if i == last and w.shape[-1] == 1:
                # A single output (a Q-value): a product and a sum over the features. A batched matmul of
                # a matrix by a vector takes a slow path on a CPU (5x slower here, backward too), and under
                # bf16 autocast this keeps the value in float32 (the weights are float32).
                h = (h * rearrange(w, "n d 1 -> n 1 d")).sum(dim=-1, keepdim=True) + b
            else:
                h = torch.baddbmm(b, h, w)
            if i < last:
                h = F.relu(h)
        return h.reshape(self.n, *lead, h.shape[-1])


class QEnsemble(nn.Module):
    """`n_q` Q-functions Q_k(x, a): features x (..., D) and normalised actions a (..., A) -> (n_q, ...)."""

    def __init__(self, n_q: int, in_dim: int, action_dim: int, hidden_dims: list[int]):
        super().__init__()
        self.net = EnsembleMLP(n_q, in_dim + action_dim, hidden_dims, 1)

    def forward(self, x: Tensor, action: Tensor, detach_params: bool = False) -> Tensor:
        return self.net(torch.cat([x, action], dim=-1), detach_params).squeeze(-1)


class PixelEncoder(nn.Module):
    """DrQ's encoder: images (N, C, H, W) in [0, 1] -> features (N, feature_dim) in [-1, 1].

    A 3x3 convolution with stride 2, `layers - 1` more with stride 1 (ReLU after each), then Linear ->
    LayerNorm -> tanh; the bounded, normalised output keeps the critics' inputs on one scale.
    """

    def __init__(
        self, in_channels: int, image_size: tuple[int, int], channels: int, layers: int, feature_dim: int
    ):
        super().__init__()
        convs: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, stride=2), nn.ReLU()]
        for _ in range(layers - 1):
            convs += [nn.Conv2d(channels, channels, 3, stride=1), nn.ReLU()]
        self.convs = nn.Sequential(*convs)
        flat = channels * math.prod(conv_output_size(side, layers) for side in image_size)
        self.head = nn.Sequential(nn.Linear(flat, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.convs(images - 0.5).flatten(start_dim=1))


def draw_shift_offsets(n: int, pad: int) -> Tensor:
    """Random (top, left) crop corners (n, 2), int64 in [0, 2 * pad], from the global CPU stream."""
    return torch.randint(0, 2 * pad + 1, (n, 2), device="cpu")


def random_shift(images: Tensor, pad: int, offsets: Tensor) -> Tensor:
    """DrQ's augmentation: images (N, C, H, W) padded by `pad` pixels (edge replicated) and cropped back to
    (H, W) at the corners `offsets` (N, 2) (`draw_shift_offsets`): each image moves by up to `pad` pixels."""
    n, _, height, width = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    offsets = offsets.to(images.device, non_blocking=True)
    rows = offsets[:, :1] + torch.arange(height, device=images.device)  # (N, H)
    cols = offsets[:, 1:] + torch.arange(width, device=images.device)  # (N, W)
    samples = torch.arange(n, device=images.device)[:, None, None]
    # Advanced indexing on the channels-last view picks each sample's window in one gather.
    pixels = rearrange(padded, "n c h w -> n h w c")[samples, rows[:, :, None], cols[:, None, :]]
    return rearrange(pixels, "n h w c -> n c h w")
