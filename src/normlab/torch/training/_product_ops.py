"""The training GEMMs' products, bias gradient and stochastic-rounding counter as PyTorch
custom ops, opaque to compilers.

Dimension letters: M rows, K in_features, N out_features.

Why custom ops: as for the operands ([normlab.torch.training._operand_ops][]), inductor would
otherwise fuse a bias into its own epilogue and reduce the bias gradient in its own
order, and the bits would change; inside an op, compiled runs execute the eager code and
give eager's bits. The step counter of NVFP4's stochastic rounding is a CPU int64 tensor
that `next_step` advances in place (a declared mutation, so compiled backward passes
advance it too).
"""

from __future__ import annotations

import torch

__all__ = ["column_sum", "gemm", "next_step"]


@torch.library.custom_op("normlab::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, trans_a: bool,
             trans_b: bool) -> torch.Tensor:
    out = (a.t() if trans_a else a) @ (b.t() if trans_b else b)
    return out if bias is None else out.add_(bias.to(torch.float32))  # in place: no new M,N


@_gemm_op.register_fake
def _(a, b, bias, trans_a, trans_b):
    rows = a.shape[1] if trans_a else a.shape[0]
    cols = b.shape[0] if trans_b else b.shape[1]
    return a.new_empty((rows, cols), dtype=torch.float32)


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *,
         trans_a: bool = False, trans_b: bool = False) -> torch.Tensor:
    """`op(a) @ op(b) (+ bias)` in float32 as eager PyTorch computes it (`op` transposes
    where asked; the transposition happens inside, so the product sees the operands'
    own strides)."""
    return _gemm_op(a, b, bias, trans_a, trans_b)


@torch.library.custom_op("normlab::column_sum", mutates_args=())
def _column_sum_op(dy: torch.Tensor) -> torch.Tensor:
    return dy.to(torch.float32).sum(0)


@_column_sum_op.register_fake
def _(dy):
    return dy.new_empty((dy.shape[1],), dtype=torch.float32)


def column_sum(dy: torch.Tensor) -> torch.Tensor:
    """The bias gradient `float32(dy).sum(0)` in eager's summation order, shape (N,)."""
    return _column_sum_op(dy)


@torch.library.custom_op("normlab::next_step", mutates_args=("counter",))
def _next_step_op(counter: torch.Tensor) -> torch.Tensor:
    step = counter.clone()
    counter.add_(1)
    return step


@_next_step_op.register_fake
def _(counter):
    return torch.empty_like(counter)


def next_step(counter: torch.Tensor) -> torch.Tensor:
    """The counter's value (a new 0-d tensor); the counter advances by one, in place."""
    return _next_step_op(counter)
