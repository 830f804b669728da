"""The three GEMMs of a linear layer under a recipe, as one ``torch.autograd.Function``.

Dimension letters: M rows (batch x tokens), K in_features, N out_features.

    forward  y  = q(x)_K  q(W)_K^T   (M,N)
    dgrad    dx = q(dy)_N q(W)_N     (M,K)
    wgrad    dW = q(dy)_M^T q(x)_M   (N,K)

``q(t)_A`` is ``t`` quantised with blocks along A, the GEMM's contraction dimension.
Per-tensor recipes quantise x and W once in forward and dy once in backward (their values do
not depend on the axis). Products are float32 matmuls of the dequantised operands: exact
products, float32 accumulation. The bias and its gradient stay in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from normlab.precision import recipes
from normlab.torch import _operands as ops
from normlab.torch._stochastic import splitmix64_int

__all__ = [
    "ROLES",
    "QuantLinearFunction",
    "backward_operands",
    "forward_operands",
    "quantize_operand",
    "stream_seed",
]

ROLES = ("x", "w", "dy")  # index of each operand in the delayed-scaling state
_PER_TENSOR = (recipes.Bf16Recipe, recipes.Fp8DelayedRecipe, recipes.Fp8CurrentRecipe)


def stream_seed(stream: int, counter: int, which: int) -> int:
    """A 63-bit seed for one stochastic rounding: ``splitmix64(stream * 2^32 + 2 counter +
    which) >> 1``, so distinct (layer, step, GEMM) streams start far apart."""
    word = (int(stream) * 2**32 + 2 * int(counter) + int(which)) % 2**64
    return splitmix64_int(word) >> 1  # Python ints: traceable, unlike NumPy's uint64


def quantize_operand(layer: Any, t: torch.Tensor, role: str, axis: int,
                     seed: int | None = None) -> torch.Tensor:
    """Fake-quantise operand ``t`` (float32, 2-D) of ``layer`` for a GEMM contracting ``axis``.

    ``role`` is ``"x"``, ``"w"`` or ``"dy"``; ``seed`` selects stochastic rounding (NVFP4
    gradients). Delayed scaling reads the layer's current scale and records amax(t).
    """
    r = layer.recipe
    grad_role = "backward" if role == "dy" else "forward"
    if isinstance(r, recipes.Bf16Recipe):
        return ops.round_elements(t, r.format_for(grad_role), saturate=False)
    if isinstance(r, recipes.Fp8DelayedRecipe):
        return layer.delayed_quantize(t, ROLES.index(role))
    if isinstance(r, recipes.Fp8CurrentRecipe):
        return layer.current_quantize(t, ROLES.index(role))
    if isinstance(r, recipes.MXRecipe):
        return ops.mx_blocks(t, r.format_for(grad_role), axis, r.block_size, r.scale_rule)
    if isinstance(r, recipes.NVFP4Recipe):
        return ops.nvfp4(t, axis, two_d=(role == "w" and r.two_d_weights), seed=seed)
    if isinstance(r, recipes.BlockwiseFp8Recipe):
        k = r.block_size
        block = (k, k) if role == "w" else (1, k)
        return ops.block_scaled(t, r.format_for(grad_role), axis, block,
                                power_of_2_scales=r.power_of_2_scales, epsilon=r.amax_epsilon)
    raise TypeError(f"unsupported recipe {r!r}")  # QuantLinear validated it


class QuantLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with each GEMM's operands quantised by ``layer.recipe``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Any) -> torch.Tensor:
        x32, w32 = x.to(torch.float32), weight.to(torch.float32)  # M,K  N,K
        qx, qw = forward_operands(layer, x32, w32)  # M,K  N,K
        y = qx @ qw.t()  # M,N
        if bias is not None:
            y = y + bias.to(torch.float32)
        per_tensor = isinstance(layer.recipe, _PER_TENSOR)
        ctx.save_for_backward(qx if per_tensor else x32, qw if per_tensor else w32)
        ctx.per_tensor, ctx.layer, ctx.has_bias = per_tensor, layer, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        a, b = ctx.saved_tensors  # (qx, qw) or (x, W)
        layer, dy32 = ctx.layer, dy.to(torch.float32)  # M,N
        dy_n, w_n, dy_m, x_m = backward_operands(layer, dy32, a, b, per_tensor=ctx.per_tensor)
        dx, dw = dy_n @ w_n, dy_m.t() @ x_m  # M,K  N,K
        db = dy32.sum(0) if ctx.has_bias else None  # N
        xt, wt, bt = ctx.dtypes
        return dx.to(xt), dw.to(wt), None if db is None else db.to(bt), None


def forward_operands(layer: Any, x: torch.Tensor,
                     w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward GEMM's operands `(q(x)_K, q(W)_K)` of float32 `x` (M,K) and `w` (N,K)."""
    return quantize_operand(layer, x, "x", axis=1), quantize_operand(layer, w, "w", axis=1)


def backward_operands(layer: Any, dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *,
                      per_tensor: bool) -> tuple[torch.Tensor, ...]:
    """The backward GEMMs' operands `(q(dy)_N, q(W)_N, q(dy)_M, q(x)_M)`: `dx = dy_N W_N`,
    `dW = dy_M^T x_M`.

    Per-tensor recipes: `a, b` are the forward's quantised x and W (their values do not
    depend on the axis) and dy is quantised once. Block recipes: `a, b` are x and W in
    float32, re-quantised along N, then along M (NVFP4: dy stochastically with the layer's
    streams, and both wgrad inputs through the random Hadamard transform, M padded to a
    multiple of 16).
    """
    if per_tensor:
        qdy = quantize_operand(layer, dy, "dy", axis=0)  # M,N
        return qdy, b, qdy, a
    r, x, w = layer.recipe, a, b
    seeds: list[int | None] = [None, None]
    if isinstance(r, recipes.NVFP4Recipe) and r.stochastic_gradients:
        counter = layer.next_rounding_step()
        seeds = [stream_seed(layer.seed, counter, k) for k in (0, 1)]
    dy_n = quantize_operand(layer, dy, "dy", 1, seeds[0])  # M,N
    w_n = quantize_operand(layer, w, "w", 0)  # N,K
    if isinstance(r, recipes.NVFP4Recipe) and r.hadamard:
        m = layer.hadamard_matrix  # 16,16: the recipe seed's random Hadamard transform
        dy, x = ops.hadamard_rows(dy, m), ops.hadamard_rows(x, m)  # M',N  M',K
    return dy_n, w_n, quantize_operand(layer, dy, "dy", 0, seeds[1]), quantize_operand(
        layer, x, "x", 0)
