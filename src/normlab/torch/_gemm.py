"""The three GEMMs of a linear layer under a recipe, as one `torch.autograd.Function`.

Dimension letters: M rows (batch x tokens), K in_features, N out_features.

    forward  y  = q(x)_K  q(W)_K^T   (M,N)
    dgrad    dx = q(dy)_N q(W)_N     (M,K)
    wgrad    dW = q(dy)_M^T q(x)_M   (N,K)

`q(t)_A` is `t` quantised with blocks along A, the GEMM's contraction dimension.
Per-tensor recipes quantise x and W once in forward and dy once in backward (their values do
not depend on the axis). Products are float32 matmuls of the dequantised operands: exact
products, float32 accumulation. The bias and its gradient stay in float32. Operands and
products run as the custom ops of `normlab.torch._operand_ops` (opaque to `torch.compile`,
so compiled runs give eager's bits); operands enter in the model's dtype (a bfloat16
model's are widened inside the rounding, never stored as float32 copies).

What is saved for backward follows Transformer Engine's `Linear`: its forward quantises
the input with rowwise usage for the forward GEMM and columnwise usage for wgrad, and
keeps only the columnwise (wgrad) copy once the forward GEMM is done. Here that is
`q(x)_M` as integer codes plus scales (`normlab.precision.operands.encode_operand`: one
byte per element for FP8 and MX with E8M0 scale codes, two E2M1 codes per byte with E4M3
scale codes and the tensor scale for NVFP4, after NVFP4's random Hadamard transform;
bfloat16/float16 codes for the Bf16 recipe), decoded in backward to exactly the values a
float32 copy held. Transformer Engine also keeps the quantised weight (a workspace
cached across micro-batches); here the weight parameter itself is saved (no new memory)
and `q(W)_N` is quantised from it in backward, per-tensor recipes with the scale the
forward used. Nothing of x is saved in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from normlab.precision import recipes
from normlab.precision.operands import OperandSpec, operand_spec
from normlab.torch import _operand_ops as opaque
from normlab.torch import _operands as ops
from normlab.torch import _product_ops as products
from normlab.torch._operand_ops import stream_seed
from normlab.torch.nonfinite import count_nonfinite

__all__ = [
    "ROLES",
    "QuantLinearFunction",
    "SavedOperand",
    "backward_operands",
    "forward_operands",
    "quantize_operand",
    "saved_wgrad_operand",
    "stream_seed",
    "x_operands",
]

ROLES = ("x", "w", "dy")  # index of each operand in the delayed-scaling state
_SCALED = (recipes.Fp8DelayedRecipe, recipes.Fp8CurrentRecipe)


def quantize_operand(layer: Any, t: torch.Tensor, role: str, axis: int, *,
                     step: torch.Tensor | None = None, which: int = 0,
                     hadamard: torch.Tensor | None = None) -> torch.Tensor:
    """Fake-quantise operand `t` (2-D) of `layer` for a GEMM contracting `axis` (float32).

    `role` is `"x"`, `"w"` or `"dy"`; `step` selects stochastic rounding (NVFP4 gradients,
    stream `which`), `hadamard` NVFP4's transform of the wgrad inputs. Delayed scaling
    reads the layer's current scale and records amax(t).
    """
    r = layer.recipe
    grad_role = "backward" if role == "dy" else "forward"
    if isinstance(r, recipes.Bf16Recipe):
        return ops.rounded(t, r.format_for(grad_role))
    if isinstance(r, _SCALED):
        scale = layer.operand_scale(t, ROLES.index(role))
        return ops.per_tensor(t, r.format_for(grad_role), scale)
    if isinstance(r, recipes.MXRecipe):
        return ops.mx_blocks(t, r.format_for(grad_role), axis, r.block_size, r.scale_rule)
    if isinstance(r, recipes.NVFP4Recipe):
        return ops.nvfp4(t, axis, two_d=(role == "w" and r.two_d_weights), step=step,
                         stream=layer.seed, which=which, hadamard=hadamard)
    if isinstance(r, recipes.BlockwiseFp8Recipe):
        k = r.block_size
        block = (k, k) if role == "w" else (1, k)
        return ops.block_scaled(t, r.format_for(grad_role), axis, block,
                                power_of_2_scales=r.power_of_2_scales, epsilon=r.amax_epsilon)
    raise TypeError(f"unsupported recipe {r!r}")  # QuantLinear validated it


def _hadamard(layer: Any) -> torch.Tensor | None:
    """NVFP4's random Hadamard matrix (16, 16) when the recipe transforms wgrad inputs."""
    r = layer.recipe
    return layer.hadamard_matrix if isinstance(r, recipes.NVFP4Recipe) and r.hadamard else None


@dataclass(frozen=True)
class SavedOperand:
    """The wgrad operand q(x)_M kept for backward: codes plus scales.

    Attributes
    ----------
    parts : tuple of torch.Tensor
        (codes, scales, tensor scale), as `normlab.torch._operand_ops.encode` returns them.
    spec : OperandSpec
        How x was quantised.
    shape : tuple of int
        The operand's (M', K) (M' is M padded to a multiple of 16 after NVFP4's transform).
    order : str
        Its layout ("C" or "F").
    """

    parts: tuple[torch.Tensor, ...]
    spec: OperandSpec
    shape: tuple[int, int]
    order: str

    def values(self) -> torch.Tensor:
        """The float32 operand (bit for bit what `quantize_operand` gives for it)."""
        return opaque.decode(self.parts, self.spec, self.shape, self.order)


def saved_wgrad_operand(layer: Any, x: torch.Tensor) -> SavedOperand:
    """q(x)_M of `x` (M, K) as codes plus scales; per-tensor recipes use the scale of x's
    forward quantisation (call this after it)."""
    r = layer.recipe
    spec = operand_spec(r, "x", 0)
    scale = layer.scale[0].clone() if isinstance(r, _SCALED) else None
    hadamard = _hadamard(layer)
    parts = opaque.encode(x, spec, scale=scale, hadamard=hadamard)
    rows = x.shape[0] + (-x.shape[0]) % 16 if hadamard is not None else x.shape[0]
    order = opaque.operand_order(spec, x, hadamard)  # the layout encode stored them in
    return SavedOperand(parts, spec, (rows, x.shape[1]), order)


def x_operands(layer: Any, x: torch.Tensor, keep: bool
               ) -> tuple[torch.Tensor, SavedOperand | None]:
    """`q(x)_K` of `x` (M,K) for the forward GEMM and, if `keep`, the saved wgrad operand.

    Where one quantisation serves both GEMMs (Bf16, FP8: values that do not depend on the
    axis), the values and the saved codes come from one pass over x.
    """
    r = layer.recipe
    if not (keep and isinstance(r, (recipes.Bf16Recipe, *_SCALED))):
        qx = quantize_operand(layer, x, "x", axis=1)
        return qx, saved_wgrad_operand(layer, x) if keep else None
    spec = operand_spec(r, "x", 0)
    scale = layer.operand_scale(x, 0) if isinstance(r, _SCALED) else None
    qx, parts = opaque.fake_encode(x, spec, scale=scale)
    order = opaque.operand_order(spec, x)
    return qx, SavedOperand(parts, spec, (x.shape[0], x.shape[1]), order)


def forward_operands(layer: Any, x: torch.Tensor, w: torch.Tensor, *, keep: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor, SavedOperand | None,
                                torch.Tensor | None]:
    """The forward GEMM's operands `(q(x)_K, q(W)_K)` of `x` (M,K) and `w` (N,K), then what
    backward needs of them: the saved wgrad operand of x (if `keep`) and, for per-tensor
    scaled recipes, the scale W was quantised with."""
    qx, saved = x_operands(layer, x, keep)
    qw = quantize_operand(layer, w, "w", axis=1)
    w_scale = layer.scale[1].clone() if isinstance(layer.recipe, _SCALED) else None
    return qx, qw, saved, w_scale


def backward_operands(layer: Any, dy: torch.Tensor, w: torch.Tensor,
                      saved: SavedOperand | None, w_scale: torch.Tensor | None, *,
                      dgrad: bool = True, wgrad: bool = True
                      ) -> tuple[torch.Tensor | None, ...]:
    """The backward GEMMs' operands `(q(dy)_N, q(W)_N, q(dy)_M, q(x)_M)`: `dx = dy_N W_N`,
    `dW = dy_M^T x_M` (None for a GEMM not asked for).

    Per-tensor recipes quantise dy once; W is quantised again from the weight with the
    forward's scale. Block recipes quantise dy along N and along M (NVFP4: stochastically
    with the layer's streams, the wgrad copy through the random Hadamard transform, M
    padded to a multiple of 16) and W along N. x_M is decoded from `saved`.
    """
    r = layer.recipe
    x_m = saved.values() if wgrad and saved is not None else None
    fmt_w = r.format_for("forward")
    if isinstance(r, (recipes.Bf16Recipe, *_SCALED)):
        qdy = quantize_operand(layer, dy, "dy", axis=0)  # M,N
        w_n = None
        if dgrad:
            w_n = (ops.rounded(w, fmt_w) if isinstance(r, recipes.Bf16Recipe)
                   else ops.per_tensor(w, fmt_w, w_scale))  # type: ignore[arg-type]
        return qdy, w_n, qdy, x_m
    step = None
    if isinstance(r, recipes.NVFP4Recipe) and r.stochastic_gradients:
        step = products.next_step(layer.rounding_counter)
    dy_n = w_n = dy_m = None
    if dgrad:
        dy_n = quantize_operand(layer, dy, "dy", 1, step=step, which=0)  # M,N
        w_n = quantize_operand(layer, w, "w", 0)  # N,K
    if wgrad:
        dy_m = quantize_operand(layer, dy, "dy", 0, step=step, which=1,
                                hadamard=_hadamard(layer))  # M',N
    return dy_n, w_n, dy_m, x_m


class QuantLinearFunction(torch.autograd.Function):
    """`y = x W^T + b` with each GEMM's operands quantised by `layer.recipe`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Any, keep: bool) -> torch.Tensor:
        """`keep`: grad mode was on at the call, so a backward may follow (save for it)."""
        wgrad = keep and ctx.needs_input_grad[1]  # the wgrad GEMM will run
        qx, qw, saved, w_scale = forward_operands(layer, x, weight, keep=wgrad)  # M,K  N,K
        y = products.gemm(qx, qw, bias, trans_b=True)  # M,N
        if keep:  # a backward may follow (grad mode was on)
            parts = (torch.empty(0),) * 3 if saved is None else saved.parts
            ctx.save_for_backward(weight, *parts,
                                  torch.empty(0) if w_scale is None else w_scale)
            ctx.saved_meta = None if saved is None else (saved.spec, saved.shape, saved.order)
        ctx.layer, ctx.has_bias, ctx.has_scale = layer, bias is not None, w_scale is not None
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        weight, codes, scales, tensor_scale, w_scale = ctx.saved_tensors
        if ctx.layer.scale is None:  # per-tensor recipes count in their scale step
            count_nonfinite(ctx.layer.nonfinite_operands, dy)  # M,N
        saved = (None if ctx.saved_meta is None
                 else SavedOperand((codes, scales, tensor_scale), *ctx.saved_meta))
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy_n, w_n, dy_m, x_m = backward_operands(
            ctx.layer, dy, weight, saved, w_scale if ctx.has_scale else None,
            dgrad=need_dx, wgrad=need_dw)
        xt, wt, bt = ctx.dtypes
        dx = dw = db = None
        if need_dx:
            dx = products.gemm(dy_n, w_n).to(xt)  # type: ignore[arg-type]  # M,K
        if need_dw:
            dw = products.gemm(dy_m, x_m, trans_a=True).to(wt)  # type: ignore[arg-type]  # N,K
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = products.column_sum(dy).to(bt)  # N
        return dx, dw, db, None, None
