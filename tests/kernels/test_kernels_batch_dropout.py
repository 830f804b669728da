"""BatchNorm and inverted-dropout kernels against the references.

BatchNorm oracle: the NumPy reference in float64 on the same inputs. Tolerance as for the
row norms (see test_kernels_norms.py): 8 * eps * sqrt(n) * (1 + |mean| * rstd) * scale,
n the number of values reduced per feature. Running statistics: the kernel applies the
reference's update formula to its own batch statistics, so they agree to that tolerance.
Dropout: the same generator state must give the same mask and the same bits (exact).
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import normlab as nl  # noqa: E402
from normlab._backend import kernel, use_backend  # noqa: E402


@pytest.fixture(autouse=True)
def _parallel_even_when_small(monkeypatch):
    """Small test arrays still take the multi-threaded path (normally serial below 2^17)."""
    from normlab.kernels import _adapt

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 0)


def _close(got, ref, n, kappa, scale=None):
    scale = float(np.max(np.abs(ref))) if scale is None else scale
    tol = 8 * float(np.finfo(got.dtype).eps) * np.sqrt(n) * kappa * scale + 1e-300
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert err <= tol, (err, tol)


CASES = [((64, 16), -1), ((4, 3, 5, 6), 1), ((2, 7, 3), -1), ((300, 5), -1), ((5, 2, 9), 0)]


@pytest.mark.parametrize(("shape", "axis"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_float64_reference(shape, axis, dtype, training):
    rng = np.random.default_rng(len(shape) + shape[0])
    x = (rng.standard_normal(shape) * 2 + 50).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    c = shape[axis]
    g, b = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    rm, rv = rng.standard_normal(c).astype(dtype), (rng.random(c) + 0.5).astype(dtype)
    rm_k, rv_k, rm_r, rv_r = rm.copy(), rv.copy(), rm.astype(np.float64), rv.astype(np.float64)
    with use_backend("numba"):
        assert kernel("batch_norm_forward") is not None
        out, cache = nl.batch_norm_forward(x, g, b, rm_k, rv_k, training, axis=axis,
                                           unbiased_running_var=True)
        dx, dg, db = nl.batch_norm_backward(dy, cache)
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    with use_backend("numpy"):
        rout, rcache = nl.batch_norm_forward(f64(x), f64(g), f64(b), rm_r, rv_r, training,
                                             axis=axis, unbiased_running_var=True)
        rdx, rdg, rdb = nl.batch_norm_backward(f64(dy), rcache)
    n = x.size // c
    kappa = 1 + float(np.max(np.abs(rcache.mean) * rcache.rstd))  # mean rounding, amplified
    _close(out, rout, n, kappa)
    bshape = [c if i == axis % x.ndim else 1 for i in range(x.ndim)]
    terms = float(np.max(np.abs(dy * g.reshape(bshape))) * np.max(rcache.rstd))
    _close(dx, rdx, n, kappa, max(terms, float(np.max(np.abs(rdx)))))  # terms that cancel
    _close(dg, rdg, n, kappa)
    _close(db, rdb, n, 1.0)
    _close(rm_k, rm_r, n, 1.0)
    _close(rv_k, rv_r, n, 1.0)
    assert cache.training is training and cache.mean.dtype == dtype and out.dtype == dtype


def test_batch_norm_statistics_are_robust_and_thread_independent():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4097, 3)) * 1e-2 + 1e4).astype(np.float32)  # cancels E[x^2]-m^2
    results = []
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            with use_backend("numba"):
                out, cache = nl.batch_norm_forward(x, None, None, None, None, True)
                results.append((out, cache.mean, cache.rstd,
                                *nl.batch_norm_backward(np.ones_like(x), cache)[:1]))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    x64 = x.astype(np.float64)
    true_rstd = 1 / np.sqrt(x64.var(0) + 1e-5)
    # the variance is ~1e-4 on values ~1e4: only a cancellation-free method gets 1e-5
    np.testing.assert_allclose(results[0][2], true_rstd, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.999, 0])
def test_dropout_same_rng_same_bits(dtype, p):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((33, 17)).astype(dtype)
    x[0, :3] = [np.inf, np.nan, -1.0]  # inf * 0 -> NaN and -1 * 0 -> -0.0, as the listing
    with use_backend("numba"), np.errstate(invalid="ignore"):
        assert kernel("inverted_dropout") is not None
        out, keep = nl.inverted_dropout(x, p, np.random.default_rng(3))
    with use_backend("numpy"), np.errstate(invalid="ignore"):
        rout, rkeep = nl.inverted_dropout(x, p, np.random.default_rng(3))
    assert out.dtype == rout.dtype and keep.dtype == np.bool_
    np.testing.assert_array_equal(keep, rkeep)
    np.testing.assert_array_equal(out.view(np.uint8), rout.view(np.uint8))


def test_dropout_numpy_scalar_p_keeps_reference_semantics():
    x = np.ones((4, 4), np.float32)
    with use_backend("numba"):
        out, _ = nl.inverted_dropout(x, np.float64(0.25), np.random.default_rng(0))
    with use_backend("numpy"):
        ref, _ = nl.inverted_dropout(x, np.float64(0.25), np.random.default_rng(0))
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)
