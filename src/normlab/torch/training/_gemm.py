"""The three GEMMs of a linear layer under a recipe, as one `torch.autograd.Function`.

Dimension letters: M rows (batch x tokens), K in_features, N out_features.

    forward  y  = q(x)_K  q(W)_K^T   (M,N)
    dgrad    dx = q(dy)_N q(W)_N     (M,K)
    wgrad    dW = q(dy)_M^T q(x)_M   (N,K)

`q(t)_A` is `t` quantised with blocks along A, the GEMM's contraction dimension.
Every operand is `q(t)` of the quantizer the recipe names for its role and axis
(`recipe.quantizer(role, axis)`, `normlab.precision.scaled.quantizers`, kept by the layer as
`layer.quantizers`); this module asks the
quantizer, never the recipe's class. Quantizers without blocks (elementwise rounding, one
per-tensor scale) quantise x and W once in forward and dy once in backward (their values do
not depend on the axis). Products are float32 matmuls of the dequantised operands: exact
products, float32 accumulation. A bfloat16 layer whose operands are exact in bfloat16
multiplies them in bfloat16 instead (float32 accumulation, per-tensor factors applied to
the result: `normlab.torch.training._bf16_gemm`, within one bfloat16 unit of the float32 path),
unless its `exact_gemm` is set. The bias and its gradient stay in float32. Operands and
products run as the custom ops of `normlab.torch.training._operand_ops` (opaque to `torch.compile`,
so compiled runs give eager's bits); operands enter in the model's dtype (a bfloat16
model's are widened inside the rounding, never stored as float32 copies).

What is saved for backward follows Transformer Engine's `Linear`: its forward quantises
the input with rowwise usage for the forward GEMM and columnwise usage for wgrad, and
keeps only the columnwise (wgrad) copy once the forward GEMM is done. Here that is
`q(x)_M` as integer codes plus scales (`normlab.precision.operands.operand.encode_operand`: one
byte per element for FP8 and MX with E8M0 scale codes, two E2M1 codes per byte with E4M3
scale codes and the tensor scale for NVFP4, after NVFP4's random Hadamard transform;
bfloat16/float16 codes for the Bf16 recipe), decoded in backward to exactly the values a
float32 copy held; a bfloat16 layer that multiplies in bfloat16 keeps the Bf16 recipe's x
itself (its own quantisation, as `torch.nn.Linear` keeps it). Transformer Engine also
keeps the quantised weight (a workspace cached across micro-batches); here the weight
parameter itself is saved (no new memory) and `q(W)_N` is quantised from it in backward,
per-tensor recipes with the scale the forward used. Nothing of x is saved in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from normlab.precision.scaled.quantizers import Quantizer
from normlab.torch.formats import get_format
from normlab.torch.training import _bf16_gemm as lowp
from normlab.torch.training import _operand_ops as opaque
from normlab.torch.training import _product_ops as products
from normlab.torch.training._operand_ops import stream_seed
from normlab.torch.training.nonfinite import count_nonfinite

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
_BF16 = get_format(torch.bfloat16)
_OPERAND_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize_operand(layer: Any, t: torch.Tensor, role: str, axis: int, *,
                     step: torch.Tensor | None = None, which: int = 0,
                     hadamard: torch.Tensor | None = None,
                     bf16: bool = False) -> torch.Tensor:
    """Fake-quantise operand `t` (2-D) of `layer` for a GEMM contracting `axis` (float32).

    `role` is `"x"`, `"w"` or `"dy"`; `step` selects stochastic rounding (NVFP4 gradients,
    stream `which`), `hadamard` NVFP4's transform of the wgrad inputs. A quantizer that takes
    a per-tensor scale gets the layer's (delayed scaling: the current scale, amax(t)
    recorded; current scaling: the scale of amax(t)). `bf16`: the layer multiplies in
    bfloat16, so an operand its quantizer keeps as it is comes back itself (`_itself`).
    """
    q = operand_quantizer(layer, role, axis, t)
    if bf16 and hadamard is None and _itself(q, t):
        return t
    scale = layer.operand_scale(t, ROLES.index(role)) if q.takes_scale else None
    return opaque.fake(t, q, scale=scale, step=step, stream=layer.seed, which=which,
                       hadamard=hadamard)


def operand_quantizer(layer: Any, role: str, axis: int, t: torch.Tensor) -> Quantizer:
    """The layer's quantizer of operand `role` along `axis`, for `t`'s dtype
    ([Quantizer.for_input][normlab.precision.scaled.quantizer.Quantizer.for_input]: an
    unquantised operand runs as rounding to its own format)."""
    fmt = get_format(t.dtype) if t.dtype in _OPERAND_DTYPES else None
    return layer.quantizers[role, axis].for_input(fmt)


def _itself(q: Quantizer, t: torch.Tensor) -> bool:
    """Whether bfloat16 operand `t` is its own quantisation by `q` (rounding to bfloat16:
    the Bf16 recipe, or an unquantised operand, on a bfloat16 model). On a layer that
    multiplies in bfloat16 it then enters the GEMM as it is, with no kernel pass and no
    copy (its NaNs keep their payloads; the float32 path's quantisation makes them the
    canonical quiet NaN, and `exact_gemm` keeps that path)."""
    return t.dtype == torch.bfloat16 and q.identity_on(_BF16)


def one_quantization(quantizers: dict[tuple[str, int], Quantizer],
                     role: str) -> Quantizer | None:
    """The quantizer that serves both GEMMs of operand `role` (the same on both axes and
    without blocks, so its values do not depend on the axis), or None; `quantizers` maps
    (role, axis) to the recipe's quantizer."""
    q = quantizers[role, 0]
    return q if q.axis_free and q == quantizers[role, 1] else None


def _hadamard(layer: Any) -> torch.Tensor | None:
    """The random Hadamard matrix (16, 16) of the wgrad inputs, None when the recipe has
    no transform."""
    return getattr(layer, "hadamard_matrix", None)


@dataclass(frozen=True)
class SavedOperand:
    """The wgrad operand q(x)_M kept for backward: codes plus scales.

    Attributes
    ----------
    parts : tuple of torch.Tensor
        (codes, scales, tensor scale), as `normlab.torch.training._operand_ops.encode` returns them.
    spec : Quantizer
        How x was quantised.
    shape : tuple of int
        The operand's (M', K) (M' is M padded to a multiple of 16 after NVFP4's transform).
    order : str
        Its layout ("C" or "F").
    itself : bool
        The first part is x itself (`_itself`: the bfloat16 GEMM's operand, no codes).
    """

    parts: tuple[torch.Tensor, ...]
    spec: Quantizer
    shape: tuple[int, int]
    order: str
    itself: bool = False

    def values(self) -> torch.Tensor:
        """The operand: bit for bit what `quantize_operand` gives for it (float32, or x
        itself)."""
        if self.itself:
            return self.parts[0]
        return opaque.decode(self.parts, self.spec, self.shape, self.order)


def saved_wgrad_operand(layer: Any, x: torch.Tensor) -> SavedOperand:
    """q(x)_M of `x` (M, K) as codes plus scales; per-tensor recipes use the scale of x's
    forward quantisation (call this after it)."""
    spec = operand_quantizer(layer, "x", 0, x)
    scale = layer.scale[0].clone() if spec.takes_scale else None
    hadamard = _hadamard(layer)
    parts = opaque.encode(x, spec, scale=scale, hadamard=hadamard)
    rows = x.shape[0] + (-x.shape[0]) % 16 if hadamard is not None else x.shape[0]
    order = opaque.operand_order(spec, x, hadamard)  # the layout encode stored them in
    return SavedOperand(parts, spec, (rows, x.shape[1]), order)


def x_operands(layer: Any, x: torch.Tensor, keep: bool, bf16: bool = False
               ) -> tuple[torch.Tensor, SavedOperand | None]:
    """`q(x)_K` of `x` (M,K) for the forward GEMM and, if `keep`, the saved wgrad operand.

    Where one quantisation serves both GEMMs (a quantizer whose values do not depend on the
    axis), the values and the saved codes come from one pass over x; where it keeps x as it
    is on a layer that multiplies in bfloat16 (`bf16`, `_itself`), both are x.
    """
    spec = layer.one_quantization["x"]
    q = operand_quantizer(layer, "x", 0, x) if bf16 and spec is not None else None
    if q is not None and _itself(q, x):
        empty = x.new_empty(0)
        saved = SavedOperand((x, empty, empty), q, (x.shape[0], x.shape[1]), "C", itself=True)
        return x, saved if keep else None
    if not (keep and spec is not None):
        qx = quantize_operand(layer, x, "x", axis=1)
        return qx, saved_wgrad_operand(layer, x) if keep else None
    scale = layer.operand_scale(x, 0) if spec.takes_scale else None
    qx, parts = opaque.fake_encode(x, spec, scale=scale)
    order = opaque.operand_order(spec, x)
    return qx, SavedOperand(parts, spec, (x.shape[0], x.shape[1]), order)


def forward_operands(layer: Any, x: torch.Tensor, w: torch.Tensor, *, keep: bool = True,
                     bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor,
                                                  SavedOperand | None, torch.Tensor | None]:
    """The forward GEMM's operands `(q(x)_K, q(W)_K)` of `x` (M,K) and `w` (N,K), then what
    backward needs of them: the saved wgrad operand of x (if `keep`) and, for per-tensor
    scaled recipes, the scale W was quantised with. `bf16`: the layer multiplies in
    bfloat16 (`quantize_operand`)."""
    qx, saved = x_operands(layer, x, keep, bf16)
    qw = quantize_operand(layer, w, "w", axis=1, bf16=bf16)
    w_scale = layer.scale[1].clone() if layer.quantizers["w", 1].takes_scale else None
    return qx, qw, saved, w_scale


def backward_operands(layer: Any, dy: torch.Tensor, w: torch.Tensor,
                      saved: SavedOperand | None, w_scale: torch.Tensor | None, *,
                      dgrad: bool = True, wgrad: bool = True, bf16: bool = False
                      ) -> tuple[torch.Tensor | None, ...]:
    """The backward GEMMs' operands `(q(dy)_N, q(W)_N, q(dy)_M, q(x)_M)`: `dx = dy_N W_N`,
    `dW = dy_M^T x_M` (None for a GEMM not asked for).

    Where one quantisation serves both GEMMs of an operand (`one_quantization`), dy is
    quantised once, and W again from the weight with the forward's scale. Otherwise dy is
    quantised along N and along M (NVFP4: stochastically with the layer's streams, the
    wgrad copy through the random Hadamard transform, M padded to a multiple of 16) and W
    along N. x_M is decoded from `saved`. `bf16`: the layer multiplies in bfloat16
    (`quantize_operand`).
    """
    r = layer.recipe
    x_m = saved.values() if wgrad and saved is not None else None
    if layer.one_quantization["dy"] is not None:
        qdy = quantize_operand(layer, dy, "dy", axis=0, bf16=bf16)  # M,N
        w_n = _w_for_dgrad(layer, w, w_scale, bf16) if dgrad else None
        return qdy, w_n, qdy, x_m
    step = products.next_step(layer.rounding_counter) if r.stochastic_gradients else None
    dy_n = w_n = dy_m = None
    if dgrad:
        dy_n = quantize_operand(layer, dy, "dy", 1, step=step, which=0)  # M,N
        w_n = _w_for_dgrad(layer, w, w_scale, bf16)  # N,K
    if wgrad:
        dy_m = quantize_operand(layer, dy, "dy", 0, step=step, which=1,
                                hadamard=_hadamard(layer))  # M',N
    return dy_n, w_n, dy_m, x_m


def _w_for_dgrad(layer: Any, w: torch.Tensor, w_scale: torch.Tensor | None,
                 bf16: bool) -> torch.Tensor:
    """q(W)_N: with the forward's quantizer and scale where one quantisation serves both
    GEMMs (no amax recorded again), else quantised for dgrad; `bf16` as in
    `quantize_operand`."""
    q = layer.one_quantization["w"]
    if q is not None:
        if bf16 and _itself(operand_quantizer(layer, "w", 0, w), w):
            return w
        return opaque.fake(w, q, scale=w_scale)
    return quantize_operand(layer, w, "w", 0, bf16=bf16)


def _product(layer: Any, a: lowp.GemmOperand, b: lowp.GemmOperand,
             bias: torch.Tensor | None = None, *, dtypes: tuple[torch.dtype, ...],
             out_dtype: torch.dtype, trans_a: bool = False,
             trans_b: bool = False) -> torch.Tensor:
    """One GEMM `op(a) @ op(b) (+ bias)` in float32, cast to `out_dtype`: the float32 GEMM
    of the values (the exact path), or, for a bfloat16 model (`dtypes`: input and weight)
    whose operands are exact in bfloat16, the bfloat16 GEMM of `normlab.torch.training._bf16_gemm`
    (within one bfloat16 unit of the exact path; the layer's `exact_gemm` keeps the exact
    path)."""
    if lowp.uses_bf16(a, b, dtypes, exact_gemm=getattr(layer, "exact_gemm", False)):
        return lowp.gemm(a, b, bias, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype)
    # float32 values (a bfloat16 operand that is its own quantisation, `_itself`, widened)
    return products.gemm(a.values.float(), b.values.float(), bias, trans_a=trans_a,
                         trans_b=trans_b).to(out_dtype)


def _scale_of(layer: Any, role: str) -> torch.Tensor | None:
    """The per-tensor scale operand `role` was last quantised with (None: no such scale)."""
    return None if layer.scale is None else layer.scale[ROLES.index(role)]


def _operand(layer: Any, values: torch.Tensor, role: str, axis: int, t: torch.Tensor,
             **kw: Any) -> lowp.GemmOperand:
    """A GEMM operand: `values` of `t` quantised by the layer's quantizer of (role, axis),
    with the per-tensor scale it used."""
    return lowp.GemmOperand(values, operand_quantizer(layer, role, axis, t), t,
                            _scale_of(layer, role), **kw)




class QuantLinearFunction(torch.autograd.Function):
    """`y = x W^T + b` with each GEMM's operands quantised by `layer.recipe`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Any, keep: bool) -> torch.Tensor:
        """`keep`: grad mode was on at the call, so a backward may follow (save for it)."""
        wgrad = keep and ctx.needs_input_grad[1]  # the wgrad GEMM will run
        bf16 = (x.dtype == weight.dtype == torch.bfloat16
                and not getattr(layer, "exact_gemm", False))  # a bfloat16 model's GEMMs
        qx, qw, saved, w_scale = forward_operands(layer, x, weight, keep=wgrad,
                                                  bf16=bf16)  # M,K  N,K
        y = _product(layer, _operand(layer, qx, "x", 1, x),
                     _operand(layer, qw, "w", 1, weight), bias,
                     dtypes=(x.dtype, weight.dtype), out_dtype=x.dtype, trans_b=True)  # M,N
        if keep:  # a backward may follow (grad mode was on)
            parts = (torch.empty(0),) * 3 if saved is None else saved.parts
            ctx.save_for_backward(weight, *parts,
                                  torch.empty(0) if w_scale is None else w_scale)
            ctx.saved_meta = (None if saved is None
                              else (saved.spec, saved.shape, saved.order, saved.itself))
        ctx.layer, ctx.has_bias, ctx.has_scale = layer, bias is not None, w_scale is not None
        ctx.bf16 = bf16
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        weight, codes, scales, tensor_scale, w_scale = ctx.saved_tensors
        if not ctx.layer.quantizers["dy", 1].takes_scale:  # else: in the scale step
            count_nonfinite(ctx.layer.nonfinite_operands, dy)  # M,N
        saved = (None if ctx.saved_meta is None
                 else SavedOperand((codes, scales, tensor_scale), *ctx.saved_meta))
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dy_n, w_n, dy_m, x_m = backward_operands(
            ctx.layer, dy, weight, saved, w_scale if ctx.has_scale else None,
            dgrad=need_dx, wgrad=need_dw, bf16=ctx.bf16 and dy.dtype == torch.bfloat16)
        xt, wt, bt = ctx.dtypes
        layer = ctx.layer
        dx = dw = db = None
        if need_dx:
            assert dy_n is not None and w_n is not None  # asked for: dgrad=need_dx
            # W in dgrad: the forward's scale where one quantisation serves both GEMMs,
            # else the scale of its own dgrad quantisation (the layer's current one)
            w_op = _operand(layer, w_n, "w", 0, weight)
            if ctx.has_scale and layer.one_quantization["w"] is not None:
                w_op = lowp.GemmOperand(w_n, w_op.quantizer, weight, w_scale)
            dx = _product(layer, _operand(layer, dy_n, "dy", 1, dy), w_op,
                          dtypes=(xt, wt), out_dtype=xt)  # M,K
        if need_dw:
            # asked for (wgrad=need_dw); the forward kept x: the wgrad GEMM was to run
            assert dy_m is not None and x_m is not None and saved is not None
            dw = _product(layer, _operand(layer, dy_m, "dy", 0, dy, hadamard=_hadamard(layer)),
                          lowp.GemmOperand(x_m, saved.spec, parts=saved.parts),
                          dtypes=(xt, wt), out_dtype=wt, trans_a=True)  # N,K
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = products.column_sum(dy).to(bt)  # N
        return dx, dw, db, None, None
