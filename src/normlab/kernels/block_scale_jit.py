"""Block statistics of the block-scaled recipes: the compiled loop (numba).

Dimension letters: A leading blocks of rows, R rows, C columns (x seen as (A, R, C)),
r x c the block shape, nR = ceil(R / r), nC = ceil(C / c). No fastmath: the max is taken
on integers (see [amax_bits][normlab.kernels.block_scale_jit.amax_bits]).
"""

from __future__ import annotations

from numba import prange

from normlab.kernels._adapt import jit

__all__ = ["amax_bits"]


@jit()
def amax_bits(xb, r, c, mask, out):
    """out[a, bi, bj] = max of (bits & mask) over the block; xb (A,R,C) unsigned bits.

    With the sign masked off, the unsigned order of float bits is the order of |x|, and
    every NaN pattern lies above inf, so an integer max is exact and keeps a NaN (no
    float compares: the reduction vectorises).
    """
    A, R, C = xb.shape
    nR, nC = out.shape[1], out.shape[2]
    for t in prange(A * nR):
        a, bi = t // nR, t % nR
        for bj in range(nC):
            m = out.dtype.type(0)
            j0, j1 = bj * c, min(C, (bj + 1) * c)
            for i in range(bi * r, min(R, (bi + 1) * r)):
                for j in range(j0, j1):
                    m = max(m, xb[a, i, j] & mask)
            out[a, bi, bj] = m
