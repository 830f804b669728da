"""What every kernel adapter shares: compiling, launching, and the array plumbing.

Each jitted loop is compiled twice (see `jit`): a `parallel=True` version (one
`prange` spread over the threading layer's workers) and a serial version of the same
source (`prange` runs as `range`). `launch` picks one per call, and this is the
library's whole thread policy:

* **Small inputs run serially on the calling thread.** Waking a parallel region costs tens
  of microseconds (milliseconds on shared cores) while a row norm of a few thousand values
  takes microseconds; below `PARALLEL_MIN_ELEMENTS` values the serial version runs, which
  also skips the threading layer's launch overhead altogether.
* **A forked child runs serially.** GNU OpenMP aborts a child forked after a parallel
  region ran, and the workqueue layer's threads do not survive `fork`; after
  `os.fork` (multiprocessing "fork" pools, data-loader workers) every kernel therefore
  uses the serial version, which touches no threading layer.
* **A multi-threaded version not compiled yet does not hold up the call.** Its first call
  with new argument types, when numba's disk cache lacks it, asks a helper process to
  compile it (see `normlab.kernels._background`) and runs the serial version, which
  computes the same bits, until the helper is done.
* **Layers that are not thread-safe are serialised.** The workqueue layer aborts when two
  Python threads enter a parallel region at once, so parallel launches hold a lock unless
  the layer in use is `omp` or `tbb`.

Both versions run the same loops with the same accumulation order inside a row, feature or
element, and every cross-row reduction uses fixed chunks, so results are bit-identical
whichever version and however many threads run.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np
from numba import njit

from normlab.kernels import _background

__all__ = [
    "FAST",
    "FLOATS",
    "PARALLEL_MIN_ELEMENTS",
    "DualKernel",
    "jit",
    "launch",
    "reduce_chunks",
    "rows_of",
    "same_dtype",
    "serial",
    "vec",
]

PARALLEL_MIN_ELEMENTS = 1 << 17  # 512 KiB of float32: from here on, two cores win
# Reassociate (vectorised reductions) and contract (FMA); no nnan/ninf: NaN rows stay NaN.
FAST = {"reassoc", "contract"}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the dtypes kernels serve

_STATE = {"forked": False, "parallel_ran": False, "layer_safe": False}
_LOCAL = threading.local()  # .serial: this thread asked for serial launches only
_LAUNCH_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # the parent's threading layer is unusable here (OpenMP aborts, workqueue hangs)
    if _STATE["parallel_ran"]:
        _STATE["forked"] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class DualKernel:
    """A jitted loop compiled as a parallel and as a serial function (same source)."""

    def __init__(self, fn: Callable[..., Any], fastmath: Any) -> None:
        self.parallel = njit(parallel=True, cache=True, fastmath=fastmath)(fn)
        # a distinct qualname gives the serial version its own cache files
        twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                                  fn.__defaults__, fn.__closure__)
        twin.__qualname__ = fn.__qualname__ + "_serial"
        twin.__doc__ = fn.__doc__
        self.serial = njit(cache=True, fastmath=fastmath)(twin)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        # a module-level kernel is the attribute of its name; factories call `locate_as`
        self._deferring = _background.defer_compilation(
            self.parallel, (fn.__module__, fn.__name__, None))

    def locate_as(self, module: str, factory: str, args: tuple[Any, ...]) -> None:
        """Tell the compile helper that `getattr(module, factory)(*args)` is this kernel."""
        self._deferring.locator = (module, factory, args)


def jit(fastmath: Any = False) -> Callable[[Callable[..., Any]], DualKernel]:
    """Decorator: compile a prange loop as a `DualKernel` (cached on disk)."""

    def deco(fn: Callable[..., Any]) -> DualKernel:
        return DualKernel(fn, fastmath)

    return deco


def launch(kern: DualKernel, n_elements: int, *args: Any) -> Any:
    """Run `kern` on `args` serially or in parallel (the policy in the module header)."""
    if n_elements < PARALLEL_MIN_ELEMENTS or _STATE["forked"] or getattr(_LOCAL, "serial",
                                                                           False):
        return kern.serial(*args)
    try:
        return _launch_parallel(kern, args)
    except _background.NotCompiledYet:  # compiling in the helper: the same bits, serially
        return kern.serial(*args)


def _launch_parallel(kern: DualKernel, args: tuple[Any, ...]) -> Any:
    _STATE["parallel_ran"] = True
    if _STATE["layer_safe"]:
        return kern.parallel(*args)
    with _LAUNCH_LOCK:  # the first launch, and every launch on a layer that is not thread-safe
        result = kern.parallel(*args)
        _STATE["layer_safe"] = numba.threading_layer() in ("omp", "tbb")
        return result


@contextlib.contextmanager
def serial() -> Iterator[None]:
    """Run every `launch` of this thread serially inside the block.

    For callers whose own thread budget is one, such as PyTorch under
    `torch.set_num_threads(1)`: a parallel region there would wake the threading layer's
    workers, which then compete with the caller's next operations for the cores.
    """
    before = getattr(_LOCAL, "serial", False)
    _LOCAL.serial = True
    try:
        yield
    finally:
        _LOCAL.serial = before


def same_dtype(x: np.ndarray, *others: np.ndarray | None) -> bool:
    """True when x is float32/float64, non-empty, and every given array has its dtype."""
    if x.dtype not in FLOATS or x.size == 0:
        return False
    return all(a is None or a.dtype == x.dtype for a in others)


def rows_of(a: np.ndarray, k: int) -> np.ndarray:
    """a as a C-contiguous (R, W) array over its last k dims (a view when already contiguous)."""
    if k == 1 and a.ndim == 2 and a.flags.c_contiguous:
        return a  # already (R, W): skip the view (a small call's overhead is its setup)
    w = math.prod(a.shape[a.ndim - k :])
    return np.ascontiguousarray(a).reshape(-1, w)  # (R, W)


def vec(p: np.ndarray | None, n: int, dtype: np.dtype, fill: float) -> np.ndarray:
    """A parameter flattened to (n,), or a constant vector standing in for None."""
    if p is None:
        return np.full(n, fill, dtype)
    if p.ndim == 1 and p.flags.c_contiguous:
        return p
    return np.ascontiguousarray(p).reshape(n)


def reduce_chunks(part: np.ndarray, like: np.ndarray | None) -> np.ndarray | None:
    """Sum (K, W) chunk partials in chunk order in float64; the parameter's shape and dtype."""
    if like is None:
        return None
    if part.shape[0] == 1 and part.dtype == like.dtype:  # one chunk: the sum is the row
        return part.reshape(like.shape)
    return part.sum(axis=0, dtype=np.float64).astype(like.dtype).reshape(like.shape)
