"""The fused GroupNorm kernels against the float64 NumPy reference.

Oracle: the NumPy reference (``use_backend("numpy")``) in float64 on float64 copies of the
same inputs, so the only error measured is the kernel's own rounding. Tolerance, as for
the row norms (see test_kernels_norms.py): per value a handful of roundings plus the group
statistics, whose rounding error grows at most like sqrt(M) over a group of M values, the
float32 mean's rounding amplified by rstd (kappa = 1 + max |mean| rstd), hence
    |kernel - ref| <= 8 eps sqrt(n) kappa scale
with n = M for out and dx, n = N S M for dgamma (N S products dy x_hat, each x_hat with
the group's error) and n = N S for dbeta; scale = max|ref|, for dx at least the size of
the terms that cancel (rstd |dy gamma|). float64 kernels: the same bound with eps64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import normlab as nl  # noqa: E402
from normlab import _backend  # noqa: E402
from normlab._backend import kernel, use_backend  # noqa: E402
from normlab.bench.memory import peak_extra  # noqa: E402  (the bench's measure)

NAMES = ("group_norm_forward", "group_norm_backward")


@pytest.fixture(autouse=True)
def _parallel_even_when_small(monkeypatch):
    """Small test arrays still take the multi-threaded path (normally serial below 2^17)."""
    from normlab.kernels import _adapt

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 0)


@pytest.fixture()
def served(monkeypatch):
    """Names of the GroupNorm kernels that ran and returned a result (not NotImplemented)."""
    assert _backend._load()
    calls: list[str] = []
    for name in NAMES:
        real = _backend._REGISTRY[name]

        def spy(*args, _real=real, _name=name):
            result = _real(*args)
            if result is not NotImplemented:
                calls.append(_name)
            return result

        monkeypatch.setitem(_backend._REGISTRY, name, spy)
    return calls


def _data(shape, dtype, params="both", offset=3.0, seed=0):
    rng = np.random.default_rng(seed + sum(shape))
    x = (rng.standard_normal(shape) * 2 + offset).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    g = rng.standard_normal(shape[1]).astype(dtype) if params in ("both", "gamma") else None
    b = rng.standard_normal(shape[1]).astype(dtype) if params == "both" else None
    return x, dy, g, b


def _f64(a):
    return None if a is None else a.astype(np.float64)


def _run(x, groups, g, b, dy, backend="numba"):
    with use_backend(backend):
        out, cache = nl.group_norm_forward(x, groups, g, b)
        return (out, *nl.group_norm_backward(dy, cache)), cache


def _close(got, ref, n, kappa, scale=None):
    assert got.dtype != np.float64 or ref.dtype == np.float64
    top = float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0))  # NaN groups aside
    scale = top if scale is None else max(scale, top)
    tol = 8 * float(np.finfo(got.dtype).eps) * math.sqrt(max(n, 1)) * kappa * scale + 1e-300
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err[np.isfinite(ref)] <= tol), (float(np.nanmax(err)), tol)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


def _check_against_reference(x, groups, g, b, dy, got):
    """Compare the kernel results ``got`` with the float64 reference (module tolerance)."""
    ref, rcache = _run(_f64(x), groups, _f64(g), _f64(b), _f64(dy), "numpy")
    n, c = x.shape[:2]
    s = x.size // (n * c)
    m = x.size // (n * groups)
    kappa = 1 + float(np.nanmax(np.abs(rcache.mean) * rcache.rstd))
    gain = np.ones(c) if g is None else g.astype(np.float64)
    terms = float(np.max(np.abs(dy.reshape(n, c, -1) * gain[:, None])) * np.nanmax(rcache.rstd))
    _close(got[0], ref[0], m, kappa)
    _close(got[1], ref[1], m, kappa, terms)
    for a, r, count in ((got[2], ref[2], n * s * m), (got[3], ref[3], n * s)):
        assert (a is None) == (r is None)
        if a is not None:
            _close(a, r, count, kappa)


# (shape, groups): 4-D, 2-D (S = 1), G = 1 (LayerNorm over C*S), G = C (InstanceNorm),
# three spatial dims, a channel longer than one summation block (S > 1024), a 2-D run
# longer than one block, a group of one value, one sample
CASES = [((4, 8, 5, 3), 4), ((6, 8), 4), ((3, 12, 7), 1), ((3, 12, 7), 12),
         ((2, 6, 2, 3, 4), 3), ((2, 4, 1500), 2), ((3, 2500), 1), ((5, 6), 6),
         ((1, 64, 9, 9), 32)]


@pytest.mark.parametrize(("shape", "groups"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_matches_the_float64_reference(shape, groups, dtype, served):
    x, dy, g, b = _data(shape, dtype)
    got, cache = _run(x, groups, g, b, dy)
    assert served == list(NAMES)  # the kernels ran, not the reference behind them
    assert cache.x is x and cache.num_groups == groups
    assert cache.mean.shape == cache.rstd.shape == (shape[0], groups)
    assert cache.mean.dtype == cache.rstd.dtype == dtype
    for a in got:
        assert a.dtype == dtype
    assert got[0].shape == got[1].shape == shape
    _check_against_reference(x, groups, g, b, dy, got)


@pytest.mark.parametrize("params", ["none", "gamma"])
@pytest.mark.parametrize(("shape", "groups"), [((4, 8, 5, 3), 2), ((6, 8), 4)])
def test_without_gamma_or_beta(shape, groups, params, served):
    x, dy, g, b = _data(shape, np.float32, params)
    got, _ = _run(x, groups, g, b, dy)
    assert served == list(NAMES)
    assert (got[2] is None) == (g is None) and got[3] is None
    _check_against_reference(x, groups, g, b, dy, got)


@pytest.mark.parametrize(("offset", "spread"), [(2000.0, 1.0), (100.0, 0.01), (-3e4, 5.0)])
def test_groups_far_from_zero_are_as_accurate_as_the_float32_mean_allows(offset, spread):
    """Cancellation-free statistics: x - mean carries at most half an ulp of the offset
    (the cache stores the mean in float32); tolerance one whole ulp(offset) / spread, the
    half ulp plus the roundings of rstd and of the output. E[x^2] - E[x]^2 would lose every
    digit at (2000, 1) in float32."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 16, 32, 32)) * spread + offset).astype(np.float32)
    xg = x.astype(np.float64).reshape(8, 4, -1)
    centred = xg - xg.mean(axis=-1, keepdims=True)
    ref = (centred / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + 1e-5))
    with use_backend("numba"):
        out = nl.group_norm_forward(x, 4, None, None)[0]
    bound = abs(float(np.spacing(np.float32(offset)))) / spread
    assert float(np.max(np.abs(out.reshape(ref.shape) - ref))) <= bound


def test_non_finite_values_stay_in_their_group():
    # warnings are errors in this suite: a NumPy warning on either path fails the test
    x, dy, g, b = _data((3, 8, 4, 5), np.float32)
    x[0, 2, 1, 1] = np.nan  # group (0, 1): channels 2, 3
    x[2, 5, 0, 4] = np.inf  # group (2, 2): channels 4, 5
    got, _ = _run(x, 4, g, b, dy)
    bad = np.zeros((3, 4), bool)
    bad[0, 1] = bad[2, 2] = True
    per_value = np.repeat(bad, 2, axis=1)[:, :, None, None]  # (N, C, 1, 1)
    for a in got[:2]:
        assert np.isnan(a[np.broadcast_to(per_value, a.shape)]).all()
        assert np.isfinite(a[~np.broadcast_to(per_value, a.shape)]).all()
    assert np.isnan(got[2][[2, 3, 4, 5]]).all() and np.isfinite(got[2][[0, 1, 6, 7]]).all()
    assert np.isfinite(got[3]).all()  # sum(dy) touches no x
    _check_against_reference(x, 4, g, b, dy, got)  # NaN where the reference has NaN


@pytest.mark.parametrize(("shape", "groups"), [((8, 64, 32, 64), 32), ((4096, 256), 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_buffers_are_written_in_place(shape, groups, dtype, served):
    """The kernels return the caller's buffers (bit-identical to new arrays) and allocate
    no x-sized temporary (while the calls without out= do allocate their results, so the
    measurement can fail); dx may be dout itself."""
    x, dy, g, b = _data(shape, dtype)
    want, _ = _run(x, groups, g, b, dy)
    y, bufs = np.empty_like(x), (np.empty_like(x), np.empty_like(g), np.empty_like(b))
    with use_backend("numba"):
        got, cache = nl.group_norm_forward(x, groups, g, b, out=y)
        grads = nl.group_norm_backward(dy, cache, out=bufs)
        assert got is y and all(r is o for r, o in zip(grads, bufs, strict=True))
        d = dy.copy()
        inplace = nl.group_norm_backward(d, cache, out=(d, None, None))
        assert inplace[0] is d
        small = x.nbytes // 8  # statistics, (C,) vectors and partials only
        assert peak_extra(lambda: nl.group_norm_forward(x, groups, g, b, out=y)) < small
        assert peak_extra(lambda: nl.group_norm_forward(x, groups, g, b)) >= x.nbytes
        assert peak_extra(lambda: nl.group_norm_backward(dy, cache, out=bufs)) < small
        assert peak_extra(lambda: nl.group_norm_backward(dy, cache)) >= x.nbytes
    assert set(served) == set(NAMES) and "group_norm_backward" in served[-4:]
    for a, w in zip((y, *bufs), want, strict=True):
        np.testing.assert_array_equal(a, w)
    for a, w in zip(inplace, want[1:], strict=True):
        np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize(("shape", "groups"), [((16, 32, 32, 16), 8), ((4096, 64), 4),
                                               ((64, 256, 8, 8), 32), ((3, 8, 100), 1)])
def test_results_do_not_depend_on_the_thread_count(shape, groups, monkeypatch):
    """1 and 2 threads and the serial twin give the same bits (fixed sample chunks; the
    first three shapes have several chunks, the last one)."""
    from normlab.kernels import _adapt

    x, dy, g, b = _data(shape, np.float32)
    results = []
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            results.append(_run(x, groups, g, b, dy)[0])
    finally:
        numba.set_num_threads(old)
    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 1 << 62)
    results.append(_run(x, groups, g, b, dy)[0])
    for other in results[1:]:
        for a, w in zip(other, results[0], strict=True):
            np.testing.assert_array_equal(a, w)


def test_kernel_and_reference_caches_pair_both_ways():
    x, dy, g, b = _data((4, 8, 6, 5), np.float32)
    with use_backend("numba"):
        _, cache_k = nl.group_norm_forward(x, 4, g, b)
    with use_backend("numpy"):
        _, cache_r = nl.group_norm_forward(x, 4, g, b)
        ref_of_kernel_cache = nl.group_norm_backward(dy, cache_k)
    with use_backend("numba"):
        kernel_of_ref_cache = nl.group_norm_backward(dy, cache_r)
    assert type(cache_k) is type(cache_r) and cache_k.mean.dtype == cache_r.mean.dtype
    for a, r in zip(ref_of_kernel_cache, kernel_of_ref_cache, strict=True):
        _close(a, r.astype(np.float64), 4 * 30 * 60, 3.0, float(np.max(np.abs(a))))


def test_unserved_inputs_fall_back_to_the_reference():
    x, dy, g, b = _data((4, 8, 3), np.float32)
    fwd, bwd = kernel("group_norm_forward"), kernel("group_norm_backward")
    assert fwd is not None and bwd is not None
    x16 = x.astype(np.float16)  # computed in float32 by the reference, stored as float16
    assert fwd(x16, 4, None, None, 1e-5) is NotImplemented
    assert fwd(x, 4, g.astype(np.float64), b, 1e-5) is NotImplemented
    assert fwd(x[:0], 4, g, b, 1e-5) is NotImplemented
    _, cache = nl.group_norm_forward(x, 4, g, b)
    assert bwd(dy.astype(np.float64), cache) is NotImplemented
    for args in ((x16, 4, None, None), (x, 4, g.astype(np.float64), b)):
        with use_backend("numba"):
            out, c = nl.group_norm_forward(*args)
            grads = nl.group_norm_backward(dy.astype(args[0].dtype), c)
        with use_backend("numpy"):
            rout, rc = nl.group_norm_forward(*args)
            rgrads = nl.group_norm_backward(dy.astype(args[0].dtype), rc)
        for a, r in zip((out, *grads), (rout, *rgrads), strict=True):
            assert (a is None) == (r is None)
            if a is not None:
                assert a.dtype == r.dtype
                np.testing.assert_array_equal(a, r)


def test_strided_inputs_give_the_bits_of_their_contiguous_copies(served):
    x, dy, g, b = _data((4, 8, 3, 5), np.float32)
    xs, dys = np.asfortranarray(x), x.copy()[:, :, :, ::-1]  # strided views of x's values
    dys[...] = dy
    want, _ = _run(x, 4, g, b, dy)
    got, cache = _run(xs, 4, g, b, dys)
    assert served == list(NAMES) * 2 and cache.x is xs  # the caller's array, not a copy
    for a, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize(("shape", "groups"), [((3, 8), 2), ((2, 6, 5), 3), ((2, 4, 3, 2), 4),
                                               ((1, 3, 2, 2), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_gradcheck_through_the_kernels(shape, groups, affine, served):
    rng = np.random.default_rng(len(shape) + groups)
    x = rng.standard_normal(shape)
    g = rng.standard_normal(shape[1]) if affine else None
    b = rng.standard_normal(shape[1]) if affine else None

    def fwd(x, g, b):
        return nl.group_norm_forward(x, groups, g, b)

    with use_backend("numba"):
        err = nl.gradcheck(fwd, nl.group_norm_backward, (x, g, b), rng=rng, tol=1e-6)
    assert err < 1e-6
    assert set(served) == set(NAMES)  # float64 all the way: the kernels served every call
