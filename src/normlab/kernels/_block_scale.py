"""Block statistics and block rescaling for the block-scaled recipes (numba).

Dimension letters: A leading blocks of rows, R rows, C columns (x seen as (A, R, C)),
r x c the block shape, nR = ceil(R / r), nC = ceil(C / c).

Contract: the kernel behind :func:`normlab.precision._blocks.block_amax` (NVFP4, blockwise
FP8, MX), registered as ``"block_amax"``. It receives the reference's validated arguments
and returns the same values or ``NotImplemented`` (only float32 and float64 are served):
max |x| over each block, NaN if the block holds a NaN, in x's dtype (exact: a max is one
of the inputs), shape ``lead + (nR, nC)`` or ``lead + (nC,)``. One pass over x, parallel
over rows of blocks; the result does not depend on the thread count. (Rescaling the blocks
needs no kernel: NumPy broadcasts one value per block in a single pass.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import prange

from normlab._backend import register
from normlab.kernels._adapt import jit, launch

__all__: list[str] = []

_SERVED = (np.dtype(np.float32), np.dtype(np.float64))


@jit()
def _amax_bits(xb, r, c, mask, out):
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


def _as3(x: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """x as a C-contiguous (A, R, C) array (R = 1 for 1-D blocks)."""
    tail = x.shape[x.ndim - len(block):]
    R, C = tail if len(tail) == 2 else (1, tail[0])
    return np.ascontiguousarray(x).reshape(-1, R, C)


def _rc(block: tuple[int, ...]) -> tuple[int, int]:
    return (block[0], block[1]) if len(block) == 2 else (1, block[0])


@register("block_amax")
def block_amax(x: np.ndarray, block: tuple[int, ...]) -> Any:
    """Kernel of the reference ``block_amax`` (float32/float64 x)."""
    if x.dtype not in _SERVED:
        return NotImplemented
    x3 = _as3(x, block)  # A,R,C
    r, c = _rc(block)
    utype: Any = np.uint32 if x.dtype == np.float32 else np.uint64
    mask = utype(2 ** (8 * x.dtype.itemsize - 1) - 1)  # all bits but the sign
    bits = np.empty((x3.shape[0], -(-x3.shape[1] // r), -(-x3.shape[2] // c)), utype)
    launch(_amax_bits, x.size, x3.view(utype), r, c, mask, bits)
    out = bits.view(x.dtype)
    lead = x.shape[: x.ndim - len(block)]
    return out.reshape(*lead, *out.shape[1:]) if len(block) == 2 else out.reshape(
        *lead, out.shape[2])
