"""The bound's yardstick: how fast this machine copies memory, measured in the same run.

A large float32 copy (read + write) into an existing buffer, the best of `np.copyto` and
the numba `prange` copy of [normlab.kernels.copy][] when the kernels are there, gives the
copy bandwidth; "bound" = bytes an op must move / that bandwidth. `src.copy()` into a new
array gives a second, lower bandwidth: the OS zero-fills the pages of every new array, a
cost each op that returns a fresh array also pays ("bound+new").

Rows that reuse `out=` buffers are held to a sharper yardstick,
[against_copy][normlab.bench.bandwidth.against_copy]: the op and the all-core copy of
the same array are timed in alternating rounds, so a busy spell of a shared machine or a
change of its memory speed hits both, and the row's ratio is the median over rounds of
the op's time over the time of copying its bytes.
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from normlab import _backend
from normlab.bench.timing import MIN_SAMPLE_S, alternate, measure, relative_iqr

__all__ = ["against_copy", "copy_bandwidth", "kernel_threads"]
_MIN_ROUNDS, _MAX_ROUNDS = 10, 40


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


def against_copy(fn: Callable[[], Any], src: np.ndarray, copies: float,
                 budget: float) -> dict[str, Any]:
    """Time `fn` in alternation with the all-core copy of `src` (the same bytes).

    Each round times `fn` and `normlab.kernels.copy.parallel_copy` of `src` into a
    scratch array back to back (the order alternates, see
    [alternate][normlab.bench.timing.alternate]); the bound of a round is `copies` times
    its copy time, where `copies` is the op's bytes moved over the copy's (2 `src.nbytes`).

    Parameters
    ----------
    fn : callable
        The op (no arguments), writing into buffers allocated once.
    src : numpy.ndarray
        The array whose copy is the yardstick (C-contiguous).
    copies : float
        Bytes the op must move, in units of one copy of `src` (read + write).
    budget : float
        Seconds to spend, roughly: 10 to 40 rounds.

    Returns
    -------
    fields : dict
        The row's `normlab_s`, `normlab_min_s`, `normlab_spread`, `normlab_samples`,
        `normlab_stable` (True: the rounds are a fixed count), `copy_s` (median copy
        time), `bound_s` = `bound_alloc_s` (`copies` times `copy_s`), `bound_ratio`
        (median over rounds of the op's time over the round's bound) and
        `bound_ratio_spread` (the interquartile spread of those ratios).

    Raises
    ------
    RuntimeError
        If the kernels are unavailable (there is no all-core copy to compare with).
    """
    module = _parallel_copy_module()
    if module is None:
        raise RuntimeError("against_copy needs the numba kernels (NORMLAB_BACKEND=numpy "
                           "or numba missing)")
    flat = np.ascontiguousarray(src).reshape(-1)  # (N,)
    scratch = np.empty_like(flat)
    parallel_copy = module.parallel_copy
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    inner = max(1, math.ceil(MIN_SAMPLE_S / max(one, 1e-9)))  # a sample lasts >= 1 ms
    round_s = inner * one * (1 + 1 / copies)
    rounds = min(_MAX_ROUNDS, max(_MIN_ROUNDS, int(budget / max(round_s, 1e-9))))
    alt = alternate(fn, lambda: parallel_copy(flat, scratch), rounds=rounds, inner=inner)
    ratios = [a / (copies * b) for a, b in zip(alt.a_s, alt.b_s, strict=True)]
    copy_s = statistics.median(alt.b_s)
    return {"normlab_s": statistics.median(alt.a_s), "normlab_min_s": min(alt.a_s),
            "normlab_spread": relative_iqr(alt.a_s), "normlab_samples": len(alt.a_s),
            "normlab_stable": True, "copy_s": copy_s, "bound_s": copies * copy_s,
            "bound_alloc_s": copies * copy_s, "bound_ratio": statistics.median(ratios),
            "bound_ratio_spread": relative_iqr(ratios)}
