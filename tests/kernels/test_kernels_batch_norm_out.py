"""The BatchNorm kernels write their ``out=`` buffers in place, for any feature axis.

Checked without timing: the registered kernels return the caller's buffers themselves (no
fallback to the reference, which would compute and copy in), and tracemalloc sees no
x-sized temporary while they run (while the same calls without ``out=`` do allocate their
x-sized results, so the measurement can fail). Results with ``out=`` are bit-identical for
1 and 2 threads and to the results without ``out=``.
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import normlab as nl  # noqa: E402
from normlab._backend import kernel, use_backend  # noqa: E402
from normlab.bench.memory import peak_extra  # noqa: E402  (the bench's measure)

# about 2^20 values each: large beside the interpreter's own allocations during a call
CASES = [((4096, 256), -1), ((8, 64, 32, 64), 1), ((16, 16, 4096), 0)]


@pytest.fixture(autouse=True)
def _parallel_even_when_small(monkeypatch):
    """Small test arrays still take the multi-threaded path (normally serial below 2^17)."""
    from normlab.kernels import _adapt

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 0)


def _data(shape, axis, dtype=np.float32):
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) + 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    g, b = (rng.standard_normal(shape[axis]).astype(dtype) for _ in range(2))
    return x, dy, g, b


@pytest.mark.parametrize(("shape", "axis"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
def test_kernels_return_the_buffers_and_allocate_no_x_sized_temporary(shape, axis, dtype,
                                                                       training):
    x, dy, g, b = _data(shape, axis, dtype)
    rm, rv = np.zeros_like(g), np.ones_like(g)
    ax = axis % x.ndim
    with use_backend("numba"):
        fwd, bwd = kernel("batch_norm_forward"), kernel("batch_norm_backward")
        assert fwd is not None and bwd is not None
        y = np.empty_like(x)
        got, cache, _ = fwd(x, g, b, rm, rv, training, 1e-5, ax, y)
        assert got is y  # not NotImplemented: the kernel served the buffer
        d = dy.copy()
        bufs = (d, np.empty_like(g), np.empty_like(b))  # dx in place of dout
        grads = bwd(d, cache, bufs)
        assert all(r is o for r, o in zip(grads, bufs, strict=True))
        small = x.nbytes // 8  # (C,) vectors and chunk partials only
        assert peak_extra(lambda: nl.batch_norm_forward(x, g, b, rm, rv, training, axis=axis,
                                                   out=y)) < small
        assert peak_extra(lambda: nl.batch_norm_forward(x, g, b, rm, rv, training,
                                                   axis=axis)) >= x.nbytes
        assert peak_extra(lambda: nl.batch_norm_backward(d, cache, out=bufs)) < small
        assert peak_extra(lambda: nl.batch_norm_backward(dy, cache)) >= x.nbytes


@pytest.mark.parametrize(("shape", "axis"), CASES)
def test_out_results_do_not_depend_on_the_thread_count(shape, axis):
    x, dy, g, b = _data(shape, axis)
    with use_backend("numba"):
        want, cache = nl.batch_norm_forward(x, g, b, None, None, True, axis=axis)
        want = [want, *nl.batch_norm_backward(dy, cache)]
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            with use_backend("numba"):
                y = np.empty_like(x)
                _, cache = nl.batch_norm_forward(x, g, b, None, None, True, axis=axis, out=y)
                d = dy.copy()
                got = [y, *nl.batch_norm_backward(d, cache, out=(d, np.empty_like(g), None))]
            for a, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, w)
    finally:
        numba.set_num_threads(old)
