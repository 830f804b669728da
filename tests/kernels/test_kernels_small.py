"""Small inputs (the lab's and nn's sizes) take the short path: serial launch, one chunk.

Below ``PARALLEL_MIN_ELEMENTS`` values the row kernels run serially and the parameter
gradients use K = ceil(R / 256) row chunks (one for R <= 256) instead of at least 64, and
the adapters pass contiguous 2-d inputs and 1-d parameters through without views. Oracle:
the NumPy reference in float64 on the same float32 inputs; tolerance as in
test_kernels_norms (8 eps32 sqrt(n) times the output's scale, n the summed terms).
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import normlab as nl  # noqa: E402
from normlab._backend import use_backend  # noqa: E402
from normlab.kernels import row_norms_jit  # noqa: E402


def test_chunk_count_depends_on_the_shape_only():
    assert row_norms_jit.chunk_count(64, 512) == 1  # 32768 values: serial, one chunk
    assert row_norms_jit.chunk_count(300, 100) == 2  # serial, <= 256 rows a chunk
    assert row_norms_jit.chunk_count(8192, 4096) == 64  # parallel: work for every thread
    assert row_norms_jit.chunk_count(64) == 64  # without the width: the parallel rule


def _close(got, ref, n):
    tol = 8 * np.finfo(np.float32).eps * np.sqrt(n) * max(1.0, float(np.max(np.abs(ref))))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("shape", [(8, 64), (64, 512), (3, 5, 40)])
@pytest.mark.parametrize("strided_gain", [False, True])
def test_small_layer_norm_and_rms_norm_match_the_reference(shape, strided_gain):
    rng = np.random.default_rng(11)
    x, dy = (rng.standard_normal(shape, dtype=np.float32) + 2 for _ in range(2))
    w = shape[-1]
    g = rng.standard_normal(2 * w, dtype=np.float32)
    g = g[::2] if strided_gain else g[:w].copy()  # a strided view goes through the copy path
    b = rng.standard_normal(w, dtype=np.float32)
    out, cache = nl.layer_norm_forward(x, g, b)
    dx, dg, db = nl.layer_norm_backward(dy, cache)
    o2, c2 = nl.rms_norm_forward(x, g)
    dx2, dw2 = nl.rms_norm_backward(dy, c2)
    assert cache.x is x and not np.shares_memory(out, x) and not np.shares_memory(dx, dy)
    with use_backend("numpy"):
        x64, dy64, g64, b64 = (a.astype(np.float64) for a in (x, dy, g, b))
        ro, rc = nl.layer_norm_forward(x64, g64, b64)
        rdx, rdg, rdb = nl.layer_norm_backward(dy64, rc)
        ro2, rc2 = nl.rms_norm_forward(x64, g64)
        rdx2, rdw2 = nl.rms_norm_backward(dy64, rc2)
    rows = int(np.prod(shape[:-1]))
    for got, ref in ((out, ro), (dx, rdx), (o2, ro2), (dx2, rdx2)):
        _close(got, ref, w)
    for got, ref in ((dg, rdg), (db, rdb), (dw2, rdw2)):
        _close(got, ref, rows)


def test_small_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(12)
    x, dy = (rng.standard_normal((64, 512), dtype=np.float32) for _ in range(2))
    g = rng.standard_normal(512, dtype=np.float32)
    results = []
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            out, cache = nl.layer_norm_forward(x, g, g)
            o2, c2 = nl.rms_norm_forward(x, g)
            results.append((out, *nl.layer_norm_backward(dy, cache), o2,
                            *nl.rms_norm_backward(dy, c2)))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
