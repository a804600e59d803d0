"""Building blocks of the TD-MPC world model: MLPs, SimNorm, a vectorised Q ensemble, bounds normalisation,
and TD-MPC2's discrete regression of rewards and values (`TwoHot`).

Everything works on normalised quantities: observations and actions in [-1, 1] (see `BoundsNormalizer`),
latent states on the product of simplices that SimNorm produces.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from lerobot.config import FeatureConfig


class SimNorm(nn.Module):
    """Simplicial normalisation (TD-MPC2): softmax over consecutive groups of `group_dim` units.

    Keeps every latent bounded (each group sums to 1) without squashing gradients the way tanh does; a
    bounded latent keeps multi-step latent rollouts and the consistency loss well scaled.
    """

    def __init__(self, group_dim: int):
        super().__init__()
        self.group_dim = group_dim

    def forward(self, x: Tensor) -> Tensor:
        # Written out rather than `softmax(dim=-1)`: ATen's softmax over rows of 8 is about 5x slower on a CPU
        # (one short row at a time) than these whole-tensor ops.
        groups = rearrange(x, "... (g d) -> ... g d", d=self.group_dim)
        e = (groups - groups.detach().amax(dim=-1, keepdim=True)).exp()
        return rearrange(e / e.sum(dim=-1, keepdim=True), "... g d -> ... (g d)")


def elu_(x: Tensor) -> Tensor:
    """ELU (alpha = 1) of x in place, as `max(x, exp(min(x, 0)) - 1)`: the same function as `F.elu`.

    On CPUs torch's vectorised `exp` is several times faster than the `expm1` that `F.elu` calls (on a 2-core
    AMD EPYC 0.5 ms against 2.9 ms for 1088 x 256 floats, which made ELU over half of a TD-MPC planning call
    and 40% of an update; docs/tdmpc.md). `exp(x) - 1` loses relative precision only where ELU's output is
    tiny: its absolute error is the same as `F.elu`'s, under 6e-8 against float64. Elsewhere (CUDA) `F.elu`.
    """
    if x.device.type != "cpu":
        return F.elu(x, inplace=True)
    neg = torch.clamp_max(x, 0.0)  # exp of the positives would overflow for no use
    torch.exp(neg, out=neg)
    return torch.maximum(x, neg.sub_(1.0), out=x)


class _ELUFunction(torch.autograd.Function):
    """`elu_` on a copy, differentiable: the gradient is 1 where the output is positive, output + 1 elsewhere
    (ATen's `elu_backward` from the result)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        out = elu_(x.clone())
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return torch.ops.aten.elu_backward(grad, 1.0, 1.0, 1.0, True, out)


def elu(x: Tensor) -> Tensor:
    """ELU (alpha = 1) of x, out of place and differentiable (`elu_` on CPU, `F.elu` elsewhere)."""
    return _ELUFunction.apply(x) if x.device.type == "cpu" else F.elu(x)


class ELU(nn.Module):
    """`nn.ELU()` (alpha = 1) computed by `elu`: no parameters, so checkpoints are unchanged by the swap."""

    def forward(self, x: Tensor) -> Tensor:
        return elu(x)


ACTIVATIONS = ("elu", "mish")


def hidden_activation(name: str) -> nn.Module:
    """The hidden layers' activation module: "elu" (TD-MPC; `ELU`, fast on CPU) or "mish" (TD-MPC2)."""
    if name == "elu":
        return ELU()
    if name == "mish":
        return nn.Mish()
    raise ValueError(f"unknown activation {name!r}: choose one of {ACTIVATIONS}")


def activation_(act: nn.Module, x: Tensor) -> Tensor:
    """A `hidden_activation` module's function applied to x in place, for acting under `torch.no_grad()`."""
    if isinstance(act, ELU):
        return elu_(x)
    return F.mish(x, inplace=True)


def mlp(
    in_dim: int,
    hidden_dims: list[int],
    out_dim: int,
    out_act: nn.Module | None = None,
    activation: str = "elu",
) -> nn.Sequential:
    """Linear -> LayerNorm -> activation for each hidden layer, then a Linear (and `out_act` if given)."""
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden_dims]
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(d_in, d_out), nn.LayerNorm(d_out), hidden_activation(activation)]
    layers.append(nn.Linear(dims[-1], out_dim))
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


def mlp_inference(net: nn.Sequential, x: Tensor) -> Tensor:
    """`net(x)` for an `mlp` network, for acting under `torch.no_grad()`: (..., in_dim) -> (..., out_dim).

    The same ATen ops on the same numbers as `net(x)` (bit-identical results), with each activation applied
    in place on the LayerNorm output: a hidden layer allocates two tensors instead of three. Not for training:
    the in-place activation would overwrite what autograd saves.
    """
    for layer in net:
        if isinstance(layer, nn.Linear):
            x = F.linear(x, layer.weight, layer.bias)
        elif isinstance(layer, nn.LayerNorm):
            x = F.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)
        elif isinstance(layer, (ELU, nn.Mish)):
            x = activation_(layer, x)
        else:
            x = layer(x)
    return x


class QEnsemble(nn.Module):
    """`n` Q-functions Q_k(z, a) evaluated in one batched matmul per layer instead of a Python loop.

    Each member is Linear -> LayerNorm -> activation (x len(hidden_dims)) -> Linear(out_dim): a scalar Q
    with `out_dim=1`, the logits of `TwoHot` bins otherwise. Weights are stacked as (n, d_in, d_out).
    `forward(..., detach_params=True)` uses detached weights: the policy objective backpropagates through Q
    into the action without training Q itself.

    `dropout > 0` (TD-MPC2: 0.01) drops units of the first hidden layer's output before its LayerNorm, each
    member independently, in training mode only; `forward_inference` (acting) never drops.
    """

    def __init__(
        self,
        n: int,
        in_dim: int,
        hidden_dims: list[int],
        out_dim: int = 1,
        activation: str = "elu",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.n = n
        self.activation = hidden_activation(activation)
        self.dropout = dropout
        dims = [in_dim, *hidden_dims, out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.ln_weights = nn.ParameterList()
        self.ln_biases = nn.ParameterList()
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            # Same init as nn.Linear, independently per member; the output layer starts at zero so that
            # early TD targets are the rewards alone (as in TD-MPC; zero logits decode to 0 as well).
            bound = 1.0 / math.sqrt(d_in)
            last = i == len(dims) - 2
            w = torch.zeros(n, d_in, d_out) if last else torch.empty(n, d_in, d_out).uniform_(-bound, bound)
            b = torch.zeros(n, d_out) if last else torch.empty(n, d_out).uniform_(-bound, bound)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))
            if not last:
                self.ln_weights.append(nn.Parameter(torch.ones(n, d_out)))
                self.ln_biases.append(nn.Parameter(torch.zeros(n, d_out)))

    def forward(self, x: Tensor, detach_params: bool = False) -> Tensor:
        """Head outputs (n, ..., out_dim) for inputs x (..., in_dim)."""
        batch_shape = x.shape[:-1]
        h = x.reshape(1, -1, x.shape[-1]).expand(self.n, -1, -1)  # (n, N, in_dim)
        n_layers = len(self.weights)
        for i in range(n_layers):
            w, b = self.weights[i], self.biases[i]
            if detach_params:
                w, b = w.detach(), b.detach()
            h = member_linear(h, w, b)  # (n, N, d_out)
            if i == 0 and self.dropout > 0 and self.training:
                h = F.dropout(h, self.dropout)
            if i < n_layers - 1:
                g, beta = self.ln_weights[i], self.ln_biases[i]
                if detach_params:
                    g, beta = g.detach(), beta.detach()
                h = self.activation(F.layer_norm(h, h.shape[-1:]) * g.unsqueeze(1) + beta.unsqueeze(1))
        return h.reshape(self.n, *batch_shape, h.shape[-1])

    def forward_inference(self, x: Tensor) -> Tensor:
        """`forward(x)` for rows x (N, in_dim) -> (n, N, out_dim), for acting under `torch.no_grad()`.

        The same ops as `forward` in eval mode (bit-identical results), with the LayerNorm affine and the
        activation applied in place: a hidden layer allocates two (n, N, d) tensors (matmul, LayerNorm)
        instead of five.
        """
        h = x.unsqueeze(0).expand(self.n, -1, -1)  # (n, N, in_dim)
        n_layers = len(self.weights)
        for i in range(n_layers):
            h = member_linear(h, self.weights[i], self.biases[i])  # (n, N, d_out)
            if i < n_layers - 1:
                h = F.layer_norm(h, h.shape[-1:])
                h.mul_(self.ln_weights[i].unsqueeze(1)).add_(self.ln_biases[i].unsqueeze(1))
                activation_(self.activation, h)
        return h


def member_linear(h: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """Each member's affine layer: h (n, N, d_in), w (n, d_in, d_out), b (n, d_out) -> (n, N, d_out).

    A one-output layer is a dot product per row: as a batched matmul it would run about 7x slower on a CPU.
    """
    if w.shape[-1] == 1:
        return (torch.linalg.vecdot(h, w.transpose(1, 2)) + b).unsqueeze(-1)
    return torch.baddbmm(b.unsqueeze(1), h, w)


def symlog(x: Tensor) -> Tensor:
    """sign(x) * log(1 + |x|): compresses large magnitudes, near the identity around 0."""
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: Tensor) -> Tensor:
    """The inverse of `symlog`: sign(x) * (exp(|x|) - 1)."""
    return torch.sign(x) * torch.expm1(x.abs())


class TwoHot(nn.Module):
    """TD-MPC2's discrete regression: a scalar as a categorical over `num_bins` points evenly spaced on
    [-`symlog_range`, `symlog_range`] in symlog space (beyond TD-MPC as published).

    A head outputs logits (..., num_bins); its value is symexp of the softmax-weighted mean bin, and it learns
    by cross-entropy against the target's two-hot encoding (the two bins around symlog(target), weighted
    by closeness). The loss's scale does not depend on the size of the returns, which is what lets one set of
    loss weights fit tasks whose returns differ by orders of magnitude; the default range covers
    |values| up to symexp(10), about 22,000.
    """

    def __init__(self, num_bins: int, symlog_range: float = 10.0):
        super().__init__()
        if num_bins < 2:
            raise ValueError(f"TwoHot needs at least 2 bins, got {num_bins}")
        self.num_bins = num_bins
        self.low, self.high = -symlog_range, symlog_range
        # The bin centres in symlog space (num_bins,): derived from the two numbers above, so not saved.
        self.register_buffer("bins", torch.linspace(self.low, self.high, num_bins), persistent=False)

    def encode(self, x: Tensor) -> Tensor:
        """Two-hot targets (..., num_bins) for scalars x (...), clipped to the range."""
        pos = (symlog(x.float()).clamp(self.low, self.high) - self.low) / (self.high - self.low)
        pos = pos * (self.num_bins - 1)
        lower = pos.floor().clamp(max=self.num_bins - 2)  # the top of the range is the last bin, weight 1
        upper_weight = (pos - lower).unsqueeze(-1)
        index = lower.long().unsqueeze(-1)
        out = x.new_zeros(*x.shape, self.num_bins, dtype=torch.float32)
        out.scatter_(-1, index, 1.0 - upper_weight)
        return out.scatter_(-1, index + 1, upper_weight)

    def decode(self, logits: Tensor) -> Tensor:
        """Scalars (...) from logits (..., num_bins)."""
        probs = torch.softmax(logits.float(), dim=-1)
        return symexp(probs @ self.bins)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy (...) of logits (..., num_bins) against the two-hot encoding of target (...), which
        broadcasts against the logits' leading dims (each target is encoded once)."""
        return -(self.encode(target) * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


class BoundsNormalizer(nn.Module):
    """Affine maps between feature bounds [low, high] and [-1, 1], with the bounds stored as buffers.

    The bounds live in the state dict, so a checkpoint carries its own normalisation (no dataset needed).
    A bound given as one number applies to every element of the feature.
    """

    def __init__(self, features: dict[str, FeatureConfig]):
        super().__init__()
        self.keys = sorted(features)
        for key in self.keys:
            feat = features[key]
            shape = tuple(feat.shape)
            # A scalar feature (e.g. a task index) has one bound each, given as a one-element list.
            low = (
                torch.as_tensor(feat.low, dtype=torch.float32)
                .reshape(-1 if shape else ())
                .expand(shape)
                .clone()
            )
            high = (
                torch.as_tensor(feat.high, dtype=torch.float32)
                .reshape(-1 if shape else ())
                .expand(shape)
                .clone()
            )
            if torch.any(high <= low):
                raise ValueError(
                    f"feature {key!r}: every high must exceed its low, got {feat.low}, {feat.high}"
                )
            safe = key.replace(".", "_")
            self.register_buffer(f"{safe}_center", (high + low) / 2)
            self.register_buffer(f"{safe}_half_range", (high - low) / 2)

    def _stats(self, key: str) -> tuple[Tensor, Tensor]:
        safe = key.replace(".", "_")
        return getattr(self, f"{safe}_center"), getattr(self, f"{safe}_half_range")

    def normalize(self, key: str, x: Tensor) -> Tensor:
        """Map x (..., *shape) from [low, high] to [-1, 1]."""
        center, half = self._stats(key)
        return (x - center) / half

    def unnormalize(self, key: str, x: Tensor) -> Tensor:
        """Map x (..., *shape) from [-1, 1] back to [low, high]."""
        center, half = self._stats(key)
        return x * half + center


# Bounds of the Gaussian prior's log-std (`WorldModel.pi_sample`), as TD-MPC2.
LOG_STD_MIN, LOG_STD_MAX = -10.0, 2.0


class WorldModel(nn.Module):
    """Encoder h, latent dynamics d, reward head R, Q ensemble and tanh policy prior pi of TD-MPC.

    Shapes: observations (..., obs_dim) and actions (..., action_dim) are normalised to [-1, 1]; latents are
    (..., latent_dim). Q returns (n_q, ...).

    `stochastic_prior=False` (TD-MPC): pi is deterministic, tanh of an MLP. True (TD-MPC2): pi_head outputs
    the mean and log-std of a Gaussian squashed by tanh (`pi_sample` draws from it); `pi` is its mean's tanh.

    `activation` is the hidden layers' ("elu": TD-MPC, "mish": TD-MPC2); `q_dropout` the Q ensemble's
    first-layer dropout (TD-MPC2: 0.01).

    `value_bins=0` (TD-MPC): the reward head and each Q output one scalar, learned by squared error.
    `value_bins >= 2` (TD-MPC2): they output `TwoHot` logits, learned by cross-entropy; `reward` and `q`
    decode them, so planning and the policy objective see scalars either way. A head's raw output
    (`reward_outputs`, `q_outputs`: (..., n_out)) has two uses: `to_scalar` and `regression_loss`.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        latent_dim: int,
        enc_dim: int,
        mlp_dim: int,
        simnorm_dim: int,
        n_q: int,
        value_bins: int = 0,
        stochastic_prior: bool = False,
        activation: str = "elu",
        q_dropout: float = 0.0,
    ):
        super().__init__()
        self.action_dim = action_dim
        self.stochastic_prior = stochastic_prior
        self.two_hot = TwoHot(value_bins) if value_bins else None
        n_out = value_bins if value_bins else 1
        act = activation
        self.encoder = mlp(obs_dim, [enc_dim], latent_dim, SimNorm(simnorm_dim), act)
        self.dynamics = mlp(latent_dim + action_dim, [mlp_dim] * 2, latent_dim, SimNorm(simnorm_dim), act)
        self.reward_head = mlp(latent_dim + action_dim, [mlp_dim] * 2, n_out, activation=act)
        if stochastic_prior:  # mean and log-std before the tanh
            self.pi_head = mlp(latent_dim, [mlp_dim] * 2, 2 * action_dim, activation=act)
        else:
            self.pi_head = mlp(latent_dim, [mlp_dim] * 2, action_dim, nn.Tanh(), act)
        self.q_ensemble = QEnsemble(
            n_q, latent_dim + action_dim, [mlp_dim] * 2, n_out, activation=act, dropout=q_dropout
        )
        # Zero-initialised reward output: predicted rewards start at 0 rather than at random values.
        nn.init.zeros_(self.reward_head[-1].weight)
        nn.init.zeros_(self.reward_head[-1].bias)

    def encode(self, obs: Tensor) -> Tensor:
        return self.encoder(obs)

    def next(self, z: Tensor, a: Tensor) -> Tensor:
        """Next latent d(z, a)."""
        return self.dynamics(torch.cat([z, a], dim=-1))

    def to_scalar(self, out: Tensor) -> Tensor:
        """A reward or Q head's value (...) from its raw output (..., n_out)."""
        return out.squeeze(-1) if self.two_hot is None else self.two_hot.decode(out)

    def regression_loss(self, out: Tensor, target: Tensor) -> Tensor:
        """Per-element loss (...) of a head's raw output (..., n_out) against scalar targets broadcastable to
        (...)."""
        if self.two_hot is None:
            return (out.squeeze(-1) - target) ** 2
        return self.two_hot.loss(out, target)

    def reward_outputs(self, z: Tensor, a: Tensor) -> Tensor:
        """The reward head's raw output (..., n_out)."""
        return self.reward_head(torch.cat([z, a], dim=-1))

    def reward(self, z: Tensor, a: Tensor) -> Tensor:
        """Predicted reward R(z, a), shape (...)."""
        return self.to_scalar(self.reward_outputs(z, a))

    def pi(self, z: Tensor) -> Tensor:
        """Policy prior's action in [-1, 1] (the Gaussian's mean through the tanh with `stochastic_prior`)."""
        return self.prior_mean(self.pi_head(z))

    def prior_mean(self, out: Tensor) -> Tensor:
        """The prior's action (..., A) from pi_head's output (..., A or 2A)."""
        return torch.tanh(out[..., : self.action_dim]) if self.stochastic_prior else out

    def pi_sample(self, z: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """A draw from the Gaussian prior, tanh(mean + std * eps), and its log-density, for eps (..., A).

        Returns actions (..., A) in (-1, 1) and log pi(a | z) (...), with the tanh's change of variables.
        """
        mean, raw_log_std = self.pi_head(z).chunk(2, dim=-1)
        # A smooth squash of the log-std into [LOG_STD_MIN, LOG_STD_MAX] (TD-MPC2's bounds).
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw_log_std) + 1)
        action = torch.tanh(mean + log_std.exp() * eps)
        gaussian = -0.5 * eps**2 - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = (gaussian - torch.log(F.relu(1 - action**2) + 1e-6)).sum(dim=-1)
        return action, log_prob

    def pi_noisy(self, z: Tensor, eps: Tensor, min_std: float) -> Tensor:
        """The prior's action with Gaussian noise eps (..., A), for the planner's policy trajectories: a draw
        from the Gaussian prior, or the deterministic prior's action plus `min_std` * eps, clipped."""
        if self.stochastic_prior:
            return self.pi_sample(z, eps)[0]
        return (self.pi(z) + min_std * eps).clamp(-1, 1)

    def q_outputs(self, z: Tensor, a: Tensor, detach_params: bool = False) -> Tensor:
        """The Q ensemble's raw outputs (n_q, ..., n_out)."""
        return self.q_ensemble(torch.cat([z, a], dim=-1), detach_params=detach_params)

    def q(self, z: Tensor, a: Tensor, detach_params: bool = False) -> Tensor:
        """All Q values, shape (n_q, ...)."""
        return self.to_scalar(self.q_outputs(z, a, detach_params))
