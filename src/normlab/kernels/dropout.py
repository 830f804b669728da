"""Inverted dropout kernel: compare, mask and scale fused in one pass (numba).

Dimension letters: N elements (flattened C order).

Contract: receives the validated ``(x, drop_probability, rng)`` of ``_inverted_dropout_ref``
(:mod:`normlab.dropout`) and returns ``(out, keep)`` bit-identical to the reference for the
same generator state. The uniforms are drawn exactly as the listing draws them,
``rng.random(x.shape)`` (float64, C order), so the generator advances identically; the
kernel then computes ``keep = u >= p`` and ``out = (x * keep) / (1 - p)`` in x's dtype in
one sweep instead of NumPy's four temporaries. No fastmath: the division must not become a
multiplication by a reciprocal. Served: float32/float64 x and a Python ``float``/``int`` p
(NumPy scalars change the result dtype under NumPy's promotion rules: the reference runs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from normlab._backend import register
from normlab.kernels._threads import threads_for

__all__: list[str] = []


@njit(parallel=True, cache=True)
def _mask_scale(x, u, p, q, out, keep):
    """keep = u >= p; out = (x * keep) / q, with x, u, out, keep (N,) and q = 1 - p."""
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        k = u[i] >= p
        keep[i] = k
        out[i] = (x[i] * (one if k else zero)) / q


@register("inverted_dropout")
def inverted_dropout(x: np.ndarray, drop_probability: Any, rng: np.random.Generator) -> Any:
    """Kernel of ``_inverted_dropout_ref``: same draw, fused mask and scale."""
    if x.dtype not in (np.float32, np.float64) or type(drop_probability) not in (float, int):
        return NotImplemented
    u = rng.random(x.shape)  # (*x.shape) float64: the listing's draw, same generator state
    p = float(drop_probability)
    q = np.array(1 - drop_probability, dtype=x.dtype)[()]  # NumPy casts the weak scalar
    out = np.empty(x.shape, x.dtype)
    keep = np.empty(x.shape, np.bool_)
    with threads_for(x.size):
        _mask_scale(np.ascontiguousarray(x).reshape(-1), u.reshape(-1), p, q,
                    out.reshape(-1), keep.reshape(-1))
    return out, keep
