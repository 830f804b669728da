"""Thread policy of the kernels: small inputs run on the calling thread only.

Waking the worker threads of a parallel region costs tens of microseconds on an idle
machine and can cost milliseconds when the cores are shared, while a row norm or a
quantize of a few thousand values takes microseconds on one core. Below
``PARALLEL_MIN_ELEMENTS`` values the kernels therefore run with one thread (the same
compiled code: results do not depend on the thread count).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from numba import get_num_threads, set_num_threads

__all__ = ["PARALLEL_MIN_ELEMENTS", "threads_for"]

PARALLEL_MIN_ELEMENTS = 1 << 17  # 512 KiB of float32: from here on, two cores win


@contextmanager
def threads_for(n_elements: int) -> Iterator[None]:
    """Run the enclosed kernel calls on one thread when ``n_elements`` is small."""
    if n_elements >= PARALLEL_MIN_ELEMENTS:
        yield
        return
    old = get_num_threads()
    set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(old)
