"""A multi-threaded copy: the bandwidth yardstick of the benchmark (numba).

Dimension letters: N elements. Not an op of the library: [normlab.bench][] times it next
to `np.copyto` to measure how fast this machine moves memory with all cores, which is
the bound the fused kernels are compared with.
"""

from __future__ import annotations

import numba
from numba import njit, prange

__all__ = ["num_threads", "parallel_copy"]


@njit(parallel=True, cache=True)
def parallel_copy(src, dst):
    """dst[i] = src[i] for 1-d arrays of N elements, one prange."""
    for i in prange(src.shape[0]):
        dst[i] = src[i]


def num_threads() -> int:
    """Threads the kernels run on (numba's current setting)."""
    return int(numba.get_num_threads())
