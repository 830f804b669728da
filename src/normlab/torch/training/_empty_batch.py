"""The product of an empty batch (no rows), which still takes part in the amax collectives.

Contract: `EmptyBatchFunction.apply(x, w, b, layer, training)` returns the empty
`(0, N)` output of `x` `(0, K)` in `x`'s dtype, and its backward zero weight and bias
gradients, as `torch.nn.Linear` does. A data-parallel rank whose share of the last batch
is empty must still enter every collective the other ranks enter (see
[normlab.torch.training.training_mode][]): in a training forward the per-tensor recipes' scale step
(`layer.operand_scale`) runs for x (amax 0) and W, and in the backward for dy (amax 0),
in the order the full product (`normlab.torch.training._gemm`) runs them, so the amax
all-reduces of current scaling match the other ranks' and the delayed-scaling history
records the step as pending on every rank. Recipes without a per-tensor scale
(no quantizer that takes a per-tensor scale) have no collective and no state to touch.
"""

from __future__ import annotations

from typing import Any

import torch

from normlab.torch.training.training_mode import is_training_forward

__all__ = ["EmptyBatchFunction"]


class EmptyBatchFunction(torch.autograd.Function):
    """`y = x W^T + b` for `x` with no rows; the scale steps run as for a full batch."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: Any, training: bool) -> torch.Tensor:
        if training:  # the scale steps of a full batch's forward GEMM (amax 0 for x)
            for index, (t, role) in enumerate(((x, "x"), (weight, "w"))):
                if layer.quantizers[role, 1].takes_scale:
                    layer.operand_scale(t, index)
        y = x.to(torch.float32) @ weight.to(torch.float32).t()  # 0,N
        if bias is not None:
            y = y + bias.to(torch.float32)
        ctx.layer, ctx.x_dtype, ctx.k = layer, x.dtype, x.shape[1]
        ctx.has_bias = bias is not None
        ctx.save_for_backward(weight)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        (weight,) = ctx.saved_tensors
        layer = ctx.layer
        if is_training_forward(layer):  # the scale steps of a full batch's backward
            if layer.quantizers["dy", 1].takes_scale:
                layer.operand_scale(dy, 2)  # the dy all-reduce (amax 0)
            dgrad_w = layer.quantizers["w", 0]
            if (ctx.needs_input_grad[0] and dgrad_w.takes_scale
                    and layer.one_quantization["w"] is None):
                layer.operand_scale(weight, 1)  # W scaled again for dgrad (its own scale)
        dx = dy.new_zeros((0, ctx.k), dtype=ctx.x_dtype)  # 0,K
        dw = torch.zeros_like(weight)  # N,K
        db = weight.new_zeros(weight.shape[0]) if ctx.has_bias else None  # N
        return dx, dw, db, None, None
