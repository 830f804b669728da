"""`out=` buffers of the norms: validation, and filling them from a computed result.

Contract (NumPy's and PyTorch's convention): a forward takes `out=` for its one array
result (x's shape and dtype); a backward takes a tuple with one entry per result, `(dx,
dgamma, dbeta)` or `(dx, dweight)`, each an array or None (that result is then newly
allocated; it must be None where the parameter is None). Buffers are checked by
`normlab._validate.check_out` (shape, dtype, C-contiguity, writeability) before any
work. Aliasing: the forward's `out` must not overlap x (the cache keeps x for the
backward) nor a parameter (nor BatchNorm's running statistics); the backward's dx may be
`dout` itself (each element of dout is read before dx's is written, on both paths; for
BatchNorm and GroupNorm every per-feature or per-group sum of dout is complete before dx
is written), and must not overlap x; parameter gradients must not overlap anything.

The fused add + norm forwards return two arrays, so their `out` is a tuple `(out,
new_residual)`, each entry an array or None. Each may be x or residual itself (the sum
reads an element of both before writing it, and the norm reads a row of the sum, not of x);
neither may overlap a parameter or the other entry. Their backwards take the plain norm's
tuple; dx must not overlap dresidual (the kernel adds it after writing dx).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import check_out, check_out_tuple

__all__ = [
    "add_forward_out",
    "as_grad",
    "backward_out",
    "fill",
    "fill_grads",
    "filled",
    "forward_out",
    "seam_extra",
]


def forward_out(out: Any, x: np.ndarray, params: tuple[tuple[str, np.ndarray | None], ...]
                ) -> np.ndarray | None:
    """The forward's validated `out` (x's shape and dtype) or None."""
    inputs = (("x (kept by the cache for the backward)", x, False),
              *((name, p, False) for name, p in params))
    return check_out(out, x.shape, x.dtype, inputs=inputs)


def add_forward_out(out: Any, x: np.ndarray, residual: np.ndarray,
                    params: tuple[tuple[str, np.ndarray | None], ...]
                    ) -> tuple[np.ndarray | None, np.ndarray | None] | None:
    """The fused add + norm forward's validated `(out, new_residual)` tuple or None."""
    out = check_out_tuple(out, ("out", "new_residual"))
    if out is None:
        return None
    shared = (("x", x, True), ("residual", residual, True),
              *((name, p, False) for name, p in params))
    y = check_out(out[0], x.shape, x.dtype, "out[0] (out)", inputs=shared)
    s = check_out(out[1], x.shape, np.result_type(x, residual), "out[1] (new_residual)",
                  inputs=(*shared, ("out[0] (out)", y, False)))
    return y, s


def backward_out(out: Any, dout: np.ndarray, x: np.ndarray,
                 grads: tuple[tuple[str, np.ndarray | None], ...],
                 dresidual: np.ndarray | None = None,
                 ) -> tuple[np.ndarray | None, ...] | None:
    """The backward's validated `out` tuple (dx, then one entry per parameter) or None.

    `dresidual` (the add + norm backwards): an input that no buffer may overlap.
    """
    out = check_out_tuple(out, ("dx", *(name for name, _ in grads)))
    if out is None:
        return None
    dx = check_out(out[0], x.shape, x.dtype, "out[0] (dx)",
                   inputs=(("dout", dout, True), ("the forward input x", x, False),
                           ("dresidual", dresidual, False)))
    result: list[np.ndarray | None] = [dx]
    for i, (name, like) in enumerate(grads, start=1):
        label = f"out[{i}] ({name})"
        if like is None:
            if out[i] is not None:
                raise ValueError(f"{label} must be None: the layer has no such parameter; "
                                 f"got {type(out[i]).__name__}")
            result.append(None)
            continue
        others = (("dout", dout, False), ("the forward input x", x, False),
                  ("dresidual", dresidual, False),
                  ("out[0] (dx)", dx, False), *((f"out[{j}]", result[j], False)
                                                for j in range(1, i)))
        result.append(check_out(out[i], like.shape, like.dtype, label, inputs=others))
    return tuple(result)


def seam_extra(dest: Any) -> tuple[Any, ...]:
    """The extra seam argument: `(dest,)` when `out=` was given, else nothing."""
    return () if dest is None else (dest,)


def fill(dest: np.ndarray | None, value: np.ndarray | None) -> np.ndarray | None:
    """`value` itself without a buffer; else `value` copied into `dest`, and dest."""
    if dest is None or value is None:
        return value
    if value is not dest:
        np.copyto(dest, value.reshape(dest.shape))
    return dest


def as_grad(g: np.ndarray | None, like: np.ndarray | None) -> np.ndarray | None:
    """Cast a parameter gradient to its parameter's dtype (None when there is no parameter)."""
    if g is None or like is None:
        return None
    return np.asarray(g).astype(like.dtype, copy=False)


def filled(dest: np.ndarray | None, value: np.ndarray) -> np.ndarray:
    """`value`, or `dest` holding it when an `out=` buffer was given."""
    result = fill(dest, value)
    assert result is not None
    return result


def fill_grads(
    dest: tuple[Any, ...], dx: np.ndarray, *grads: tuple[np.ndarray | None, np.ndarray | None]
) -> Any:
    """`(dx, *parameter gradients)` of a backward reference, each in its `out=` buffer of
    `dest` where given: dx as computed (already in x's dtype), each `(grad, parameter)` of
    `grads` cast to its parameter's dtype (None without the parameter)."""
    return (filled(dest[0], dx),
            *(fill(d, as_grad(g, like)) for d, (g, like) in zip(dest[1:], grads, strict=True)))
