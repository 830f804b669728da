"""Inverted dropout's fused loop: compare, mask and scale in one pass (numba).

Dimension letters: N elements (flattened C order). No fastmath: the division must not
become a multiplication by a reciprocal.
"""

from __future__ import annotations

from numba import prange

from normlab.kernels._adapt import jit

__all__ = ["mask_scale"]


@jit()
def mask_scale(x, u, p, q, out, keep):
    """keep = u >= p; out = (x * keep) / q, with x, u, out, keep (N,) and q = 1 - p."""
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    for i in prange(x.shape[0]):
        k = u[i] >= p
        keep[i] = k
        out[i] = (x[i] * (one if k else zero)) / q
