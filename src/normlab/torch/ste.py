"""Quantisation with a straight-through gradient: forward rounds, backward is the identity.

Contract: `quantize_ste(t, fmt, ...)` returns exactly [normlab.torch.quantize][]'s
tensor and, under autograd, `d out / d t = 1` elementwise (the straight-through
estimator of Bengio, Leonard and Courville, "Estimating or Propagating Gradients Through
Stochastic Neurons for Conditional Computation", 2013), the gradient keeping t's dtype.
The forward has no Python branch on tensor values once compiled (the native-cast fast
path's data-dependent check is skipped under `torch.compile`), so
`torch.compile(..., fullgraph=True)` traces it whole, in every rounding mode. A seed that
changes between calls becomes a symbolic int after the first recompile (no recompile per seed); the
SplitMix64 words are built from its two 32-bit halves, so the generated code holds only
int64 constants. Inductor passes symbolic ints as int64: there, seeds must be below 2^63
(the recipes' stream seeds are 63-bit); eager and `aot_eager` take any seed in [0, 2^64).
"""

from __future__ import annotations

from typing import Any

from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.quantize import quantize

__all__ = ["quantize_ste"]


class _QuantizeSTE(torch.autograd.Function):
    """Forward: quantize; backward: pass the gradient through unchanged."""

    @staticmethod
    def forward(
        t: torch.Tensor, fmt: Any, rounding: str, saturate: bool, seed: int | None,
        random_bits: torch.Tensor | None,
    ) -> torch.Tensor:
        return quantize(t, fmt, rounding=rounding, saturate=saturate, seed=seed,
                        random_bits=random_bits)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass  # nothing to save: the backward is the identity

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None, None, None, None, None


def quantize_ste(
    t: torch.Tensor,
    fmt: Any,
    *,
    rounding: str = "nearest",
    saturate: bool = False,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round `t` to `fmt` in the forward pass; the backward passes the gradient through.

    Formula: forward `q = quantize(t)`; backward `dL/dt = dL/dq` (identity Jacobian).

    Parameters
    ----------
    t : torch.Tensor
        Float32, float64, bfloat16 or float16, any shape and device.
    fmt, rounding, saturate, seed, random_bits
        As [normlab.torch.quantize][].

    Returns
    -------
    q : torch.Tensor
        The dtype, shape and device of `t`, attached to the autograd graph when `t`
        requires grad.

    Raises
    ------
    TypeError
        As [normlab.torch.quantize][] (checked before the graph is touched).
    ValueError
        As [normlab.torch.quantize][] (checked before the graph is touched).

    Examples
    --------
    >>> x = torch.tensor([1.1, 2.9], requires_grad=True)
    >>> y = quantize_ste(x, "e2m1")
    >>> y.sum().backward(); x.grad
    tensor([1., 1.])
    """
    fmt = get_format(fmt)  # validated here, a Format (data) in the graph
    return _QuantizeSTE.apply(t, fmt, rounding, saturate, seed, random_bits)
