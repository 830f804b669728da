"""A multi-threaded copy: the bandwidth yardstick of the benchmark (numba).

Dimension letters: N elements. Not an op of the library (no public function dispatches to
it, and the `normlab.kernels` package does not export it): [normlab.bench][] times it in
alternation with the kernels, on the same bytes, as the bound they are compared with.

The copy uses every core the kernels use (one contiguous share of the elements per thread)
and the same software prefetch as they do ([normlab.kernels.prefetch_jit][]): the lines
`ahead` elements on are requested for reading (the source) and for writing (the
destination) between blocks of `BLOCK_BYTES`, so no kernel can beat its bound by a trick
the copy lacks. Stores are ordinary stores, as in the kernels (each destination line is
read for ownership before it is written).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from normlab.kernels.prefetch_jit import BLOCK_BYTES, ahead_of, read_span, write_span

__all__ = ["num_threads", "parallel_copy"]


@njit(parallel=True, cache=True)
def _copy(src, dst, ahead, shares):
    N = src.shape[0]  # src, dst: (N,)
    blk = BLOCK_BYTES // src.itemsize
    for t in prange(shares):
        lo = (N * t) // shares
        hi = (N * (t + 1)) // shares
        for j0 in range(lo, hi, blk):
            j1 = min(j0 + blk, hi)
            if ahead > 0:
                read_span(src, j0 + ahead, j1 + ahead)
                write_span(dst, j0 + ahead, j1 + ahead)
            s = src[j0:j1]  # 1-d views: the loop from 0 vectorises
            d = dst[j0:j1]
            for j in range(s.shape[0]):
                d[j] = s[j]


def parallel_copy(src: np.ndarray, dst: np.ndarray) -> None:
    """`dst[i] = src[i]` for 1-d C-contiguous arrays of N elements, on every thread.

    Parameters
    ----------
    src : numpy.ndarray
        Shape (N,).
    dst : numpy.ndarray
        Shape (N,), the same dtype; written in place.
    """
    _copy(src, dst, ahead_of(src), numba.get_num_threads())


def num_threads() -> int:
    """Threads the kernels run on (numba's current setting).

    Returns
    -------
    threads : int
        `numba.get_num_threads()`.
    """
    return int(numba.get_num_threads())
