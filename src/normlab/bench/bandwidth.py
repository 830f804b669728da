"""The bound's yardstick: how fast this machine copies memory, measured in the same run.

A large float32 copy (read + write) into an existing buffer, the best of `np.copyto` and
the numba `prange` copy of [normlab.kernels.copy][] when the kernels are there, gives the
copy bandwidth; "bound" = bytes an op must move / that bandwidth. `src.copy()` into a new
array gives a second, lower bandwidth: the OS zero-fills the pages of every new array, a
cost each op that returns a fresh array also pays ("bound+new").
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from normlab import _backend
from normlab.bench.timing import measure

__all__ = ["copy_bandwidth", "kernel_threads"]


def _parallel_copy_module() -> ModuleType | None:
    if _backend.kernel("layer_norm_forward") is None:
        return None
    return importlib.import_module("normlab.kernels.copy")


def copy_bandwidth(nbytes: int, budget: float) -> tuple[float, float]:
    """Bytes per second of a copy into an existing buffer and of `src.copy()`.

    Parameters
    ----------
    nbytes : int
        Size of the source buffer (at least 64 MiB streams from memory, not the caches).
    budget : float
        Seconds per timed copy.

    Returns
    -------
    into_existing : float
        Read + write bytes per second into an existing buffer (best of NumPy and numba).
    into_new : float
        Read + write bytes per second of `src.copy()` (page zero-fill included).
    """
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = measure(lambda: np.copyto(dst, src), budget_s=budget).median_s
    copy = _parallel_copy_module()
    if copy is not None:
        parallel = copy.parallel_copy
        best = min(best, measure(lambda: parallel(src, dst), budget_s=budget).median_s)
    fresh = measure(src.copy, budget_s=budget).median_s
    return 2 * src.nbytes / best, 2 * src.nbytes / fresh


def kernel_threads() -> int | None:
    """Threads the numba kernels run on, or None without kernels.

    Returns
    -------
    threads : int or None
        numba's current thread count.
    """
    copy = _parallel_copy_module()
    return None if copy is None else int(copy.num_threads())
