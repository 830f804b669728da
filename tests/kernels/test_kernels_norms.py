"""Fused LayerNorm / RMSNorm / add+norm kernels against float64 references.

Oracle: the NumPy reference run in float64 (``use_backend("numpy")`` on float64 copies of
the same float32 inputs), so the only error measured is the kernel's own float32 rounding.

Tolerance (float32 kernels): per element a handful of float32 roundings (centre, scale,
gain, bias) plus the row statistics, whose rounding error grows at most like sqrt(W) over a
row of W terms; the per-row mean is stored in float32 (the cache contract), so its rounding
|mean| * eps32 is amplified by rstd. Hence
    |kernel - ref| <= 8 * eps32 * sqrt(W) * (1 + |mean| * rstd) * scale
with ``scale`` the largest magnitude of that output. Parameter gradients sum R rows, so W
is replaced by R there. float64 kernels: the same bound with eps64.
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


NAMES = ("layer_norm_forward", "layer_norm_backward", "rms_norm_forward", "rms_norm_backward",
         "add_layer_norm_forward", "add_rms_norm_forward")


def _eps(dt: np.dtype) -> float:
    return float(np.finfo(dt).eps)


def _close(got: np.ndarray, ref: np.ndarray, n: int, kappa: np.ndarray | float = 1.0,
           terms: float = 0.0) -> None:
    """Assert the module's tolerance: 8 eps sqrt(n) (1 + |mean| rstd) scale (see header).

    scale = max|ref|, or ``terms`` when larger: the size of the terms that cancel in dx
    (rstd * |dy * gamma|), whose rounding can leave a tiny nonzero where dx is exactly 0.
    """
    assert got.dtype != np.float64 or ref.dtype == np.float64
    scale = max(np.max(np.abs(ref)) if ref.size else 0.0, terms)
    tol = 8 * _eps(got.dtype) * np.sqrt(max(n, 1)) * np.max(kappa) * scale + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err[np.isfinite(ref)] <= tol), (float(np.nanmax(err)), float(tol))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


def _kappa(x: np.ndarray, k: int = 1) -> float:
    """Conditioning of the rows: 1 + |mean| * rstd (the float32 mean's rounding, amplified)."""
    red = tuple(range(x.ndim - k, x.ndim))
    x64 = x.astype(np.float64)
    return float(np.max(1 + np.abs(x64.mean(red)) / np.sqrt(x64.var(red) + 1e-5)))


def _ln(x, g, b, dy, k=1):  # float32 kernel result and float64 reference, fwd + bwd
    with use_backend("numba"):
        assert kernel("layer_norm_forward") is not None
        out, cache = nl.layer_norm_forward(x, g, b, normalized_ndim=k)
        grads = nl.layer_norm_backward(dy, cache)
    f64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
    with use_backend("numpy"):
        rout, rcache = nl.layer_norm_forward(f64(x), f64(g), f64(b), normalized_ndim=k)
        rgrads = nl.layer_norm_backward(f64(dy), rcache)
    return (out, *grads), (rout, *rgrads)


SHAPES = [(1, 1), (1, 7), (3, 33), (17, 1000), (5, 4099), (257, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_random(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    dy = rng.standard_normal(shape).astype(dtype)
    g, b = (rng.standard_normal(shape[-1:]).astype(dtype) for _ in range(2))
    got, ref = _ln(x, g, b, dy)
    kap = _kappa(x)
    x64 = x.astype(np.float64)
    terms = np.max(np.abs(dy * g)) / np.sqrt(np.min(x64.var(-1)) + 1e-5)
    _close(got[0], ref[0], shape[-1], kap)
    _close(got[1], ref[1], shape[-1], kap, terms)
    _close(got[2], ref[2], shape[0] * shape[-1], kap)  # rows summed; x_hat itself is O(W)
    _close(got[3], ref[3], shape[0])
    for a, r in zip(got, ref, strict=True):
        assert a.dtype == dtype and a.shape == r.shape


@pytest.mark.parametrize(("offset", "spread"), [(2000.0, 1.0), (100.0, 0.01), (-3e4, 5.0)])
def test_layer_norm_large_offsets(offset, spread):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((16, 512)) * spread + offset).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    got, ref = _ln(x, None, None, dy)
    kap = _kappa(x)
    assert kap > 10  # the test is about badly conditioned rows
    _close(got[0], ref[0], 512, kap)
    _close(got[1], ref[1], 512, kap)
    assert got[2] is None and got[3] is None


@pytest.mark.parametrize("fused_add", [False, True])
@pytest.mark.parametrize(("offset", "spread"), [(2000.0, 1.0), (100.0, 0.01), (1e4, 1.0)])
def test_layer_norm_offset_rows_as_accurate_as_the_mean_allows(offset, spread, fused_add):
    """Wide float32 rows far from zero: the output error is set by the float32 mean alone.

    The cache contract stores the mean in float32, so x - mean carries up to half an ulp of
    the offset, i.e. ulp(offset) / 2 / spread after scaling. Tolerance: one whole
    ulp(offset) / spread (the half ulp, plus the rounding of rstd and of the output). A
    first-pass float32 row sum without the two-pass correction of the mean misses this
    by 1.2-1.6x at width 4096 (measured), so the bound can fail.
    """
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 4096)) * spread + offset).astype(np.float32)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(axis=-1, keepdims=True)
    ref = centred / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + 1e-5)
    if fused_add:
        out = nl.add_layer_norm_forward(x, np.zeros_like(x), None, None)[0]
    else:
        out = nl.layer_norm_forward(x, None, None)[0]
    bound = float(np.spacing(np.float32(offset))) / spread
    assert float(np.max(np.abs(out - ref))) <= bound


def test_nan_row_stays_in_its_row_and_strided_views():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((12, 2 * 301)).astype(np.float32)
    x = base[::2, ::2]  # strided (6, 301) view: the kernel copies it to C order
    x[1, 5] = np.nan
    dy = np.asfortranarray(rng.standard_normal(x.shape).astype(np.float32))
    g = rng.standard_normal(301).astype(np.float32)[::-1]  # negative stride
    got, ref = _ln(x, g, None, dy)
    assert np.isnan(got[0][1]).all() and np.isfinite(np.delete(got[0], 1, 0)).all()
    rows = np.arange(6) != 1
    _close(got[0][rows], ref[0][rows], 301, _kappa(x[rows]))
    _close(got[1][rows], ref[1][rows], 301, _kappa(x[rows]))


def test_multi_dim_normalized_shape_and_empty():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = rng.standard_normal((4, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    got, ref = _ln(x, g, g, dy, k=2)
    _close(got[0], ref[0], 20, _kappa(x, 2))
    _close(got[2], ref[2], 6 * 20, _kappa(x, 2))
    e = np.zeros((0, 8), np.float32)  # empty batch: the reference serves it
    got, ref = _ln(e, np.ones(8, np.float32), np.zeros(8, np.float32), e)
    assert got[0].shape == (0, 8) and np.all(got[2] == 0) and np.all(got[3] == 0)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm(dtype, offset):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, 515)).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    w = rng.standard_normal(515).astype(dtype)
    with use_backend("numba"):
        assert kernel("rms_norm_forward") is not None
        out, cache = nl.rms_norm_forward(x, w, offset=offset)
        dx, dw = nl.rms_norm_backward(dy, cache)
    with use_backend("numpy"):
        rout, rc = nl.rms_norm_forward(x.astype(np.float64), w.astype(np.float64), offset=offset)
        rdx, rdw = nl.rms_norm_backward(dy.astype(np.float64), rc)
    _close(out, rout, 515)
    _close(dx, rdx, 515)
    _close(dw, rdw, 37 * 515)


def test_add_norms_match_the_reference():
    rng = np.random.default_rng(5)
    x, res, dy, dres = (rng.standard_normal((9, 130)).astype(np.float32) for _ in range(4))
    g, b = rng.standard_normal(130).astype(np.float32), rng.standard_normal(130).astype(np.float32)
    for fwd, bwd, params in [
        (nl.add_layer_norm_forward, nl.add_layer_norm_backward, (g, b)),
        (nl.add_rms_norm_forward, nl.add_rms_norm_backward, (g,)),
    ]:
        with use_backend("numba"):
            out, s, cache = fwd(x, res, *params)
            grads = bwd(dy, dres, cache)
        with use_backend("numpy"):
            rout, rs, rcache = fwd(x, res, *params)
            rgrads = bwd(dy, dres, rcache)
        np.testing.assert_array_equal(s, rs)  # the same single float32 addition
        _close(out, rout.astype(np.float64), 130, _kappa(rs))
        for a, r in zip(grads, rgrads, strict=True):
            _close(a, r.astype(np.float64), 9 * 130, _kappa(rs))


def test_kernel_and_reference_caches_pair_both_ways():
    rng = np.random.default_rng(6)
    x, dy = (rng.standard_normal((8, 40)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal(40).astype(np.float32)
    with use_backend("numba"):
        out_k, cache_k = nl.layer_norm_forward(x, g, g)
    with use_backend("numpy"):
        out_r, cache_r = nl.layer_norm_forward(x, g, g)
        ref_of_kernel_cache = nl.layer_norm_backward(dy, cache_k)
    with use_backend("numba"):
        kernel_of_ref_cache = nl.layer_norm_backward(dy, cache_r)
    _close(out_k, out_r.astype(np.float64), 40, _kappa(x))
    assert type(cache_k) is type(cache_r) and cache_k.x is x
    assert cache_k.mean.dtype == cache_r.mean.dtype == np.float32
    for a, r in zip(ref_of_kernel_cache, kernel_of_ref_cache, strict=True):
        _close(a, r.astype(np.float64), 8 * 40, _kappa(x))


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(7)
    x, dy = (rng.standard_normal((301, 97)).astype(np.float32) for _ in range(2))
    g = rng.standard_normal(97).astype(np.float32)
    results = []
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            with use_backend("numba"):
                out, cache = nl.layer_norm_forward(x, g, g)
                o2, c2 = nl.rms_norm_forward(x, g)
                results.append((out, *nl.layer_norm_backward(dy, cache), o2,
                                *nl.rms_norm_backward(dy, c2)))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)  # bit-identical: fixed chunks, fixed order


def test_unserved_inputs_fall_back_to_the_reference():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 16)).astype(np.float16)
    with use_backend("numba"):
        out, _ = nl.layer_norm_forward(x, None, None)  # float16: reference path
        mixed, _ = nl.layer_norm_forward(x.astype(np.float32), np.ones(16), None)  # f64 gamma
    assert out.dtype == np.float16 and mixed.dtype == np.float32
    with use_backend("numpy"):
        assert kernel("layer_norm_forward") is None
        ref, _ = nl.layer_norm_forward(x, None, None)
    np.testing.assert_array_equal(out, ref)
    for name in NAMES:
        with use_backend("numba"):
            assert kernel(name) is not None, name


def test_small_inputs_run_serially_on_the_calling_thread(monkeypatch):
    from normlab.kernels import _adapt

    calls = []

    class Fake:
        def serial(self, *args):
            calls.append("serial")

        def parallel(self, *args):
            calls.append("parallel")

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 100)
    _adapt.launch(Fake(), 99)
    _adapt.launch(Fake(), 100)
    assert calls == ["serial", "parallel"]
