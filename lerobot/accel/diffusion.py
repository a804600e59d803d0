"""Fast chunk generation for Diffusion Policy: an opt-in layer over `DiffusionPolicy`, for evaluation.

Turn it on in the run config (`inference.fast=true inference.dtype=bfloat16`, see
`lerobot.config.InferenceConfig`); evaluation runs inside `with lerobot.accel.accelerated(policy,
cfg.inference):`, which enters `fast_inference_context(policy, cfg.inference)`. At the entry of the `with`
the layer builds an `InferencePlan` from the policy's current weights, whose U-Net and image encoder stand
in for the policy's `unet` and `rgb_encoder` (the policy calls them as it calls its modules); at the exit
they are taken back, so the plain model is untouched and a change of the weights between two `with`s is
seen by the next one. The stand-ins are not submodules: the state dict and `.to()` never see the plan. With
`fast=false` and `dtype=bfloat16` the layer runs the policy's own modules under bf16 autocast instead.

`InferencePlan` runs the computation of the `nn.Module`s of `unet.py` / `vision.py`, from copies of the same
parameters, in a form that suits a CPU with few cores (it works on CUDA too):

- **Weights prepared once** in the inference dtype (bf16 uses AMX tiles on CPUs that have them) and, where
  oneDNN is available, pre-reordered into its blocked matmul layout. At batch 1 a U-Net step is a pass over
  all weights (~1 GB in fp32 for the paper's image model): halving the bytes and skipping the per-call
  reorder is most of the gain.
- **Time-major activations** `(B, T, C)`: a convolution's input windows are then `k` consecutive rows of
  memory, so unfolding them into the `(B*T_out, k*C)` matmul operand is one contiguous copy (the
  channel-major layout gathers with stride T). GroupNorm runs on the same memory viewed as a channels-last
  `(B, C, T, 1)` tensor, without a copy.
- **The transposed convolutions** that upsample time (kernel 4, stride 2): one matmul of the input with
  all 4 taps, then two shifted sums (as `TemporalUpsample1d`).
- **FiLM hoisted out of the denoising loop**: every residual block's FiLM is `Linear(Mish([step_emb,
  global_cond]))`. Mish is elementwise, so this splits into a global part (computed once per chunk, for all
  blocks in one matmul) and a step part (computed once per set of scheduler timesteps, for all blocks and
  steps in one matmul, and cached); a denoising step only adds the two rows.
- **Image encoder**: a copy of the ResNet backbone in the inference dtype with channels-last activations;
  the spatial softmax and the final linear layer run in fp32.
- **Optional int8 weights** (`int8_weights`, bf16 on CPU): every U-Net matmul also keeps its weight as
  int8 with one bf16 scale per output channel, and a call with at most `INT8_MAX_ROWS` rows (the deepest
  levels at batch 1) reads those instead: half the bytes of a pass that is bound by reading them.
- **Optional `torch.compile`** of the U-Net step (`compile`): each matmul is one opaque operator
  (`prepared_linear`) that keeps its prepared weights and kernel; inductor fuses what lies between them
  (GroupNorm, Mish, FiLM, residual sums, the window copies), ~200 small operators per step in eager, into
  single-threaded kernels.

Everything the plan builds lives on the device of the weights it is built from. The sampler's arithmetic
(the noisy sample, the scheduler step) stays fp32 in the policy; the plan takes and returns fp32.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import einops
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lerobot.config import INFERENCE_DTYPES, InferenceConfig
from lerobot.policies.diffusion.modeling import DiffusionPolicy
from lerobot.policies.diffusion.unet import (
    ConditionalUnet1D,
    FiLMResidualBlock,
    TemporalConv1d,
    interleave_upsample_taps,
)
from lerobot.policies.diffusion.vision import RgbEncoder, center_crop
from lerobot.policies.images import resize

# `inference.dtype` -> the torch dtype the networks compute in.
TORCH_DTYPES = {name: getattr(torch, name) for name in INFERENCE_DTYPES}
# Rows up to which an int8 weight beats the prepacked bf16 one: `aten._weight_int8pack_mm`'s time grows
# with the rows (its kernel has no AMX), while oneDNN's AMX kernel is bound by the weight bytes at any
# small row count, so int8's halved bytes only win while the rows are few.
INT8_MAX_ROWS = 4


def _onednn_linear_available(device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: `weight` (N, K) -> (int8 (N, K), scale (N,) fp32), such that
    `weight ~= int8 * scale[:, None]` with an error of at most `scale / 2` per element."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous(), scale


def _int8_matmul_supported(weight: Tensor, dtype: torch.dtype) -> bool:
    # `_weight_int8pack_mm` reads K in blocks of 16 and crashes the process (not an error) otherwise.
    return weight.device.type == "cpu" and dtype == torch.bfloat16 and weight.shape[1] % 16 == 0


# Every PreparedLinear by id, for the custom operator below (which takes plain values only).
_PREPARED: weakref.WeakValueDictionary[int, PreparedLinear] = weakref.WeakValueDictionary()
_PREPARED_IDS = itertools.count()


@torch.library.custom_op("lerobot::prepared_linear", mutates_args=())
def prepared_linear(x: Tensor, layer: int) -> Tensor:
    """`PreparedLinear.matmul` of layer number `layer`, (rows, K) -> (rows, N), as one operator that
    `torch.compile` does not look into: inductor fuses the normalizations and pointwise ops between the
    matmuls and leaves each matmul to the kernel its layer chose (prepacked oneDNN, or int8), whose weights
    it could not trace (oneDNN's blocked tensors are opaque)."""
    return _PREPARED[layer].matmul(x)


@prepared_linear.register_fake
def _(x: Tensor, layer: int) -> Tensor:
    return x.new_empty(x.shape[0], _PREPARED[layer].out_features)


class PreparedLinear(nn.Module):
    """`y = x @ W.T + b` for 2-D `x`, with `W` cast to `dtype` once and, on CPU with oneDNN, reordered once
    into oneDNN's blocked layout (otherwise every call reorders it again: at batch 1 that costs as much as
    the matmul).

    With `int8=True` (bf16 on CPU) it also keeps `quantize_int8(W)`, read instead of `W` by calls with at
    most `INT8_MAX_ROWS` rows, where the matmul is bound by the bytes of the weight. Under `torch.compile`
    the matmul is the opaque operator `prepared_linear`."""

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        dtype: torch.dtype,
        prepack: bool = True,
        int8: bool = False,
    ):
        super().__init__()
        self.out_features = weight.shape[0]
        self.int8_weight: Tensor | None = None
        self.int8_scale: Tensor | None = None
        if int8 and _int8_matmul_supported(weight, dtype):
            quantized, scale = quantize_int8(weight)
            self.int8_weight = nn.Parameter(quantized, requires_grad=False)
            self.int8_scale = nn.Parameter(scale.to(dtype), requires_grad=False)
        weight = weight.detach().to(dtype).contiguous()
        self.bias = nn.Parameter(bias.detach().to(dtype), requires_grad=False) if bias is not None else None
        self.packed: Tensor | None = None
        if prepack and _onednn_linear_available(weight.device):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
                probe = torch.zeros(1, weight.shape[1], dtype=dtype, device=weight.device)
                torch.ops.mkldnn._linear_pointwise(probe, packed, self.bias, "none", [], "")
                self.packed = packed  # replaces the plain copy (halves the cached memory)
            except (RuntimeError, NotImplementedError):
                pass  # this build/dtype has no packed kernel: plain `F.linear` below
        self.weight = nn.Parameter(weight, requires_grad=False) if self.packed is None else None
        self.layer_id = next(_PREPARED_IDS)
        _PREPARED[self.layer_id] = self

    def matmul(self, x: Tensor) -> Tensor:
        """The matmul itself, `x` (rows, K) -> (rows, N), with the kernel that suits `rows`."""
        if self.int8_weight is not None and x.shape[0] <= INT8_MAX_ROWS:
            out = torch._weight_int8pack_mm(x.contiguous(), self.int8_weight, self.int8_scale)
            return out if self.bias is None else out + self.bias
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return prepared_linear(x, self.layer_id)
        return self.matmul(x)


class _TimeConv(nn.Module):
    """A `TemporalConv1d` on time-major `(B, T, C_in)` -> `(B, T_out, C_out)`."""

    def __init__(self, conv: TemporalConv1d, dtype: torch.dtype, prepack: bool, int8: bool = False):
        super().__init__()
        k, c_in = conv.kernel_size, conv.in_channels
        # The module's weight columns are ordered (c, k); windows of time-major rows are ordered (k, c).
        weight = einops.rearrange(conv.weight, "o (c k) -> o (k c)", c=c_in, k=k)
        self.linear = PreparedLinear(weight, conv.bias, dtype, prepack, int8)
        self.kernel_size, self.stride, self.padding = k, conv.stride, conv.padding

    def forward(self, x: Tensor) -> Tensor:
        batch, length, channels = x.shape
        k, stride, pad = self.kernel_size, self.stride, self.padding
        if k == 1 and stride == 1 and pad == 0:
            return self.linear(x.reshape(batch * length, channels)).view(batch, length, -1)
        if pad:
            x = F.pad(x, (0, 0, pad, pad))
        x = x.contiguous()
        out_length = (length + 2 * pad - k) // stride + 1
        # Window t is rows t*stride .. t*stride+k-1, i.e. k*C consecutive elements: a strided view, then one copy.
        windows = x.as_strided((batch, out_length, k * channels), (x.stride(0), stride * channels, 1))
        return self.linear(windows.reshape(batch * out_length, k * channels)).view(batch, out_length, -1)


class _Upsample(nn.Module):
    """`TemporalUpsample1d` (a stride-2 transposed convolution) on time-major `(B, T, C)` -> `(B, 2T, C)`:
    one matmul gives every input step's product with the 4 taps, `unet.interleave_upsample_taps` sums them
    into the output steps."""

    def __init__(self, conv: nn.ConvTranspose1d, dtype: torch.dtype, prepack: bool, int8: bool = False):
        super().__init__()
        if (
            conv.kernel_size != (4,)
            or conv.stride != (2,)
            or conv.padding != (1,)
            or conv.output_padding != (0,)
            or conv.groups != 1
            or conv.dilation != (1,)
        ):
            raise ValueError(
                f"only ConvTranspose1d(kernel_size=4, stride=2, padding=1) is supported, got {conv}"
            )
        self.linear = PreparedLinear(conv.weight.view(conv.in_channels, -1).T, None, dtype, prepack, int8)
        bias = conv.bias.detach().to(dtype) if conv.bias is not None else None
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.out_channels = conv.out_channels

    def forward(self, x: Tensor) -> Tensor:
        batch, length, channels = x.shape
        taps = self.linear(x.reshape(batch * length, channels)).view(batch, length, self.out_channels, 4)
        return interleave_upsample_taps(taps, self.bias)


def _group_norm(x: Tensor, norm: nn.GroupNorm) -> Tensor:
    """GroupNorm of time-major `(B, T, C)`, computed on the channels-last view `(B, C, T, 1)` (no copy);
    the statistics are accumulated in fp32 for bf16 inputs."""
    view = x.unsqueeze(2).permute(0, 3, 1, 2)  # (B, C, T, 1), strides of channels-last
    out = F.group_norm(view, norm.num_groups, norm.weight, norm.bias, norm.eps)
    return out.permute(0, 2, 3, 1).squeeze(2)  # back to (B, T, C); contiguous when `out` is channels-last


class _ConvNormMish(nn.Module):
    def __init__(self, module: nn.Sequential, dtype: torch.dtype, prepack: bool, int8: bool = False):
        super().__init__()
        conv, norm, _ = module
        self.conv = _TimeConv(conv, dtype, prepack, int8)
        # fp32 affine parameters (GroupNorm mixes dtypes), on the device of the source's.
        self.norm = copy.deepcopy(norm).requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return F.mish(_group_norm(self.conv(x), self.norm), inplace=True)


class _Block(nn.Module):
    """A `FiLMResidualBlock` on time-major input; its FiLM terms come precomputed (see `UnetPlan`)."""

    def __init__(self, block: FiLMResidualBlock, dtype: torch.dtype, prepack: bool, int8: bool = False):
        super().__init__()
        self.conv1 = _ConvNormMish(block.conv1, dtype, prepack, int8)
        self.conv2 = _ConvNormMish(block.conv2, dtype, prepack, int8)
        skip = block.skip
        self.skip = None if isinstance(skip, nn.Identity) else _TimeConv(skip, dtype, prepack, int8)
        self.use_scale = block.use_scale
        self.channels = block.out_channels
        self.film_size = self.channels * (2 if self.use_scale else 1)

    def forward(self, x: Tensor, film: Tensor) -> Tensor:
        """`x` (B, T, C_in), `film` (B, 1, film_size) in the compute dtype -> (B, T, C_out)."""
        h = self.conv1(x)
        if self.use_scale:
            h = torch.addcmul(film[..., self.channels :], h, film[..., : self.channels])
        else:
            h = h + film
        h = self.conv2(h)
        return h.add_(x if self.skip is None else self.skip(x))


class UnetPlan(nn.Module):
    """`ConditionalUnet1D` for inference: prepared weights, time-major activations, hoisted FiLM.

    Use: `cond = plan.condition(global_cond, timesteps)` once per chunk, then `plan.denoise(sample, cond, i)`
    for the i-th of `timesteps`. `forward(sample, film)` is the U-Net evaluation itself (what `compile`
    compiles). It holds its own copies of the weights; the source U-Net is not referenced afterwards.
    """

    def __init__(
        self, unet: ConditionalUnet1D, dtype: torch.dtype, prepack: bool = True, int8_weights: bool = False
    ):
        super().__init__()
        self.dtype = dtype
        self.step_encoder = copy.deepcopy(unet.step_encoder).requires_grad_(False)  # fp32, once per set
        args = (dtype, prepack, int8_weights)
        self.down = nn.ModuleList(
            nn.ModuleList(
                [
                    _Block(r1, *args),
                    _Block(r2, *args),
                    nn.Identity() if isinstance(d, nn.Identity) else _TimeConv(d, *args),
                ]
            )
            for r1, r2, d in unet.down
        )
        self.mid = nn.ModuleList(_Block(b, *args) for b in unet.mid)
        self.up = nn.ModuleList(
            nn.ModuleList([_Block(r1, *args), _Block(r2, *args), _Upsample(u, *args)])
            for r1, r2, u in unet.up
        )
        self.final_conv = _ConvNormMish(unet.final[0], *args)
        self.final_proj = _TimeConv(unet.final[1], *args)

        # FiLM of every block in execution order, as one linear map of Mish([step_emb, global_cond]).
        blocks = [*(m for r1, r2, _ in unet.down for m in (r1, r2)), *unet.mid]
        blocks += [m for r1, r2, _ in unet.up for m in (r1, r2)]
        self.film_sizes = [b.film[1].out_features for b in blocks]
        film_weight = torch.cat([b.film[1].weight for b in blocks]).detach().float()
        embed_dim = unet.step_encoder[-1].out_features
        self.register_buffer("film_bias", torch.cat([b.film[1].bias for b in blocks]).detach().float())
        self.register_buffer("film_step_weight", film_weight[:, :embed_dim].contiguous())
        self.register_buffer("film_global_weight", film_weight[:, embed_dim:].contiguous())
        self._step_film: dict[tuple[int, ...], Tensor] = {}
        self.compiled = None  # set by InferencePlan(compile=True); not a submodule

    @torch.no_grad()
    def condition(self, global_cond: Tensor, timesteps: Tensor) -> tuple[Tensor, Tensor]:
        """FiLM terms of all blocks, once per chunk: `(global part (B, F), step part (S, F))`, fp32.

        `global_cond` (B, G); `timesteps` (S,) the scheduler's timesteps. The step part depends on the
        timesteps only and is cached across chunks. The FiLM input of the i-th step is their row sum."""
        key = tuple(int(t) for t in timesteps)
        step_part = self._step_film.get(key)
        if step_part is None:
            embedding = self.step_encoder(timesteps.to(self.film_step_weight.device))  # (S, E)
            step_part = F.linear(F.mish(embedding.float()), self.film_step_weight)  # (S, F)
            self._step_film[key] = step_part
        global_part = F.linear(F.mish(global_cond.float()), self.film_global_weight, self.film_bias)
        return global_part, step_part

    @torch.no_grad()
    def denoise(self, sample: Tensor, conditioning: tuple[Tensor, Tensor], index: int) -> Tensor:
        """`sample` (B, T, A) fp32 at the `index`-th timestep of `condition()` -> prediction (B, T, A) fp32."""
        global_part, step_part = conditioning
        film = (global_part + step_part[index]).to(self.dtype).unsqueeze(1)  # (B, 1, F)
        return (self.compiled if self.compiled is not None else self)(sample, film)

    def forward(self, sample: Tensor, film: Tensor) -> Tensor:
        """One U-Net evaluation: `sample` (B, T, A) fp32, FiLM terms `film` (B, 1, F) -> (B, T, A) fp32."""
        films = iter(film.split(self.film_sizes, dim=-1))
        x = sample.to(self.dtype)
        skips = []
        for i, (res1, res2, downsample) in enumerate(self.down):
            x = res2(res1(x, next(films)), next(films))
            if i > 0:
                skips.append(x)
            x = downsample(x)
        for res in self.mid:
            x = res(x, next(films))
        for res1, res2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=-1)
            x = upsample(res2(res1(x, next(films)), next(films)))
        return self.final_proj(self.final_conv(x)).float()


class EncoderPlan:
    """`RgbEncoder` for inference (eval mode: center crop): the backbone copied in `dtype` with channels-last
    activations; the spatial softmax and the output layer stay fp32 (they are small)."""

    def __init__(self, encoder: RgbEncoder, dtype: torch.dtype):
        self.resize_shape, self.crop_shape = encoder.resize_shape, encoder.crop_shape
        self.dtype = dtype
        self.backbone = copy.deepcopy(encoder.backbone).to(dtype=dtype, memory_format=torch.channels_last)
        self.backbone.eval().requires_grad_(False)
        self.pool = copy.deepcopy(encoder.pool).requires_grad_(False)
        self.out = copy.deepcopy(encoder.out).requires_grad_(False)

    def __call__(self, images: Tensor) -> Tensor:
        """`images` (N, C, H, W) normalized fp32 -> features (N, feature_dim) fp32."""
        images = resize(images, self.resize_shape)
        if self.crop_shape is not None and images.shape[-2:] != self.crop_shape:
            images = center_crop(images, self.crop_shape)
        images = images.to(dtype=self.dtype, memory_format=torch.channels_last)
        keypoints = self.pool(self.backbone(images).float())
        return self.out(einops.rearrange(keypoints, "n k xy -> n (k xy)"))


class InferencePlan:
    """The networks of one `DiffusionPolicy` prepared for chunk generation (see the module docstring)."""

    def __init__(
        self,
        unet: ConditionalUnet1D,
        encoder: RgbEncoder | None,
        dtype: torch.dtype,
        compile: bool = False,
        prepack: bool = True,
        int8_weights: bool = False,
    ):
        self.dtype = dtype
        with torch.no_grad():
            self.unet = UnetPlan(unet, dtype, prepack, int8_weights).eval()
            self.encoder = EncoderPlan(encoder, dtype) if encoder is not None else None
        if compile:
            # Through __dict__: as a registered submodule, the compiled wrapper would contain its own owner.
            # Default shapes: the first batch size gets a static graph, a second one a graph with a dynamic
            # batch that serves all later ones (refill evaluation varies the batch from chunk to chunk).
            # The fused kernels run on one thread: each touches at most a few hundred KB, and waking a
            # second OpenMP thread (OMP_WAIT_POLICY=PASSIVE) costs more than it saves. The matmuls keep
            # every thread.
            self.unet.__dict__["compiled"] = torch.compile(self.unet, options={"cpp.threads": 1})


@contextlib.contextmanager
def fast_inference_context(policy: DiffusionPolicy, options: InferenceConfig) -> Iterator[None]:
    """Generate the policy's chunks as `options` (the run config's `inference` section) asks, for the
    duration of the `with`.

    `fast`: an `InferencePlan` is built from the policy's weights as they are at the entry; its U-Net and
    image encoder stand in for `policy.unet` and `policy.rgb_encoder`, so that `predict_action_chunk` (hence
    `select_action`) runs them until the exit. `dtype=bfloat16` without `fast`: the policy's own modules,
    its `global_conditioning` and `sample_actions` each run under bf16 autocast (the networks of a chunk
    and nothing else). At the defaults nothing changes. At the exit the policy generates chunks with its
    modules again, in fp32; its weights and state dict are never touched. The plan lives on the device of
    the weights: move the policy before entering, not inside. One layer at a time: entering a second one
    inside the first is a `RuntimeError`.
    """
    options.validate()
    dtype = TORCH_DTYPES[options.dtype]
    if not options.fast and dtype == torch.float32:
        yield  # the defaults: the policy's own modules, as they are
        return
    active = [name for name in _STAND_IN_NAMES if name in vars(policy)]
    if active:
        # A plan built now would be built from the other layer's stand-ins.
        raise RuntimeError(
            f"{type(policy).__name__} is already inside an inference layer (stand-ins for {active}): "
            "leave that `with` before entering another"
        )
    if options.fast:
        encoder = policy.rgb_encoder if policy.image_keys else None
        plan = InferencePlan(policy.unet, encoder, dtype, options.compile, int8_weights=options.int8_weights)
        stand_ins = {"unet": plan.unet}
        if plan.encoder is not None:
            stand_ins["rgb_encoder"] = plan.encoder
    else:
        device_type = next(policy.unet.parameters()).device.type
        autocast = functools.partial(torch.autocast, device_type=device_type, dtype=dtype)
        stand_ins = {name: _inside(autocast, getattr(policy, name)) for name in _AUTOCAST_METHODS}
    with _standing_in(policy, stand_ins):
        yield


# What the bf16 autocast path runs under autocast, each call in a region of its own: the image encoder
# (inside `global_conditioning`) and the whole denoising loop, whose weight casts autocast caches across its
# steps. The ops between the two calls (a cast to fp32) are the same with or without autocast.
_AUTOCAST_METHODS = ("global_conditioning", "sample_actions")
# Every attribute of a `DiffusionPolicy` that `fast_inference_context` may stand in for.
_STAND_IN_NAMES = ("unet", "rgb_encoder", *_AUTOCAST_METHODS)


def _inside(context: Callable[[], contextlib.AbstractContextManager], method: Callable) -> Callable:
    """`method`, each call of it run inside a new `context()`."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with context():
            return method(*args, **kwargs)

    return call


@contextlib.contextmanager
def _standing_in(policy: DiffusionPolicy, stand_ins: dict[str, Any]) -> Iterator[None]:
    """`policy.<name>` is `stand_ins[name]` for the duration of the `with`.

    The stand-ins go into the instance's `__dict__`, which attribute lookup reads before the class's methods
    and before `nn.Module`'s registry of submodules: they are never registered, so `state_dict()`,
    `parameters()` and `.to()` see the policy's own modules throughout, and those are back under their
    names at the exit, however the `with` ends.
    """
    vars(policy).update(stand_ins)
    try:
        yield
    finally:
        for name in stand_ins:
            vars(policy).pop(name, None)
