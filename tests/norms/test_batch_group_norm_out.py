"""BatchNorm / GroupNorm forward and backward with out= buffers.

Expected values: the same call without ``out`` on the same backend, bit for bit (the same
arithmetic writes into a caller's buffer instead of a new one), on both backends, and the
running statistics updated exactly as without ``out``. Failed validation must leave every
buffer and both running statistics as they were.
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab._backend import use_backend

BACKENDS = ["numba", "numpy"]
DTYPES = [np.float32, np.float64]
# (shape, axis, Fortran-ordered x): features last (2-D), channels first (N, C, H, W), a
# leading feature axis, and an x the kernel must copy before reading
BN_CASES = [((64, 16), -1, False), ((4, 6, 5, 7), 1, False), ((5, 3, 9), 0, False),
            ((4, 6, 5, 7), 1, True)]


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def _bn_data(shape, axis, dtype, fortran=False):
    rng = np.random.default_rng(len(shape) * 10 + shape[0])
    x = (rng.standard_normal(shape) * 2 + 5).astype(dtype)
    x = np.asfortranarray(x) if fortran else x
    dy = rng.standard_normal(shape).astype(dtype)
    c = shape[axis]
    g, b = (rng.standard_normal(c).astype(dtype) for _ in range(2))
    rm, rv = rng.standard_normal(c).astype(dtype), (rng.random(c) + 0.5).astype(dtype)
    return x, dy, g, b, rm, rv


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "axis", "fortran"), BN_CASES)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_out_buffers_match_and_dx_may_be_dout(backend, dtype, shape, axis,
                                                         fortran, training):
    x, dy, g, b, rm, rv = _bn_data(shape, axis, dtype, fortran)
    with use_backend(backend):
        rm1, rv1 = rm.copy(), rv.copy()
        want, cache = nl.batch_norm_forward(x, g, b, rm1, rv1, training, axis=axis)
        want_grads = nl.batch_norm_backward(dy, cache)
        buf, rm2, rv2 = np.full(x.shape, np.nan, dtype), rm.copy(), rv.copy()
        got, cache2 = nl.batch_norm_forward(x, g, b, rm2, rv2, training, axis=axis, out=buf)
        assert got is buf and cache2.x is x
        _same(got, want)
        _same(rm2, rm1)  # the running statistics are updated as without out=
        _same(rv2, rv1)
        bufs = (np.empty(x.shape, dtype), np.empty_like(g), np.empty_like(b))
        grads = nl.batch_norm_backward(dy, cache2, out=bufs)
        assert all(r is o for r, o in zip(grads, bufs, strict=True))
        for a, w in zip(grads, want_grads, strict=True):
            _same(a, w)
        d = np.ascontiguousarray(dy)  # dx in place of dout; parameter gradients new
        dx, dg, db = nl.batch_norm_backward(d, cache2, out=(d, None, None))
        assert dx is d
        for a, w in zip((dx, dg, db), want_grads, strict=True):
            _same(a, w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_out_with_wider_parameters(backend, training):
    # float64 gamma on float32 x: computed in float64 (the reference), cast into the buffer
    x, dy, g, b, rm, rv = _bn_data((4, 6, 5, 7), 1, np.float32)
    g64 = g.astype(np.float64)
    with use_backend(backend):
        want, cache = nl.batch_norm_forward(x, g64, b, rm.copy(), rv.copy(), training, axis=1)
        want_grads = nl.batch_norm_backward(dy, cache)
        got, cache2 = nl.batch_norm_forward(x, g64, b, rm.copy(), rv.copy(), training, axis=1,
                                            out=np.empty_like(x))
        _same(got, want)
        d = dy.copy()
        grads = nl.batch_norm_backward(d, cache2, out=(d, np.empty(6), None))
        assert grads[0] is d
        for a, w in zip(grads, want_grads, strict=True):
            _same(a, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_out_without_parameters(backend):
    x, dy, *_ = _bn_data((32, 8), -1, np.float32)
    with use_backend(backend):
        want, cache = nl.batch_norm_forward(x, None, None, None, None, True)
        got, cache2 = nl.batch_norm_forward(x, None, None, None, None, True,
                                            out=np.empty_like(x))
        _same(got, want)
        dx, dg, db = nl.batch_norm_backward(dy, cache2, out=(np.empty_like(x), None, None))
        _same(dx, nl.batch_norm_backward(dy, cache)[0])
        assert dg is None and db is None
        with pytest.raises(ValueError, match=r"out\[1\] \(dgamma\) must be None"):
            nl.batch_norm_backward(dy, cache2, out=(None, np.empty(8, np.float32), None))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [*DTYPES, np.float16])  # float16: computed in float32
@pytest.mark.parametrize("shape", [(6, 8), (4, 8, 5, 3)])
def test_group_norm_out_buffers_match_and_dx_may_be_dout(backend, dtype, shape):
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * 2 + 5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    g, b = (rng.standard_normal(8).astype(dtype) for _ in range(2))
    with use_backend(backend):
        want, cache = nl.group_norm_forward(x, 4, g, b)
        want_grads = nl.group_norm_backward(dy, cache)
        buf = np.full(x.shape, np.nan, dtype)
        got, cache2 = nl.group_norm_forward(x, 4, g, b, out=buf)
        assert got is buf and cache2.x is x
        _same(got, want)
        bufs = (np.empty_like(x), np.empty_like(g), np.empty_like(b))
        grads = nl.group_norm_backward(dy, cache2, out=bufs)
        assert all(r is o for r, o in zip(grads, bufs, strict=True))
        for a, w in zip(grads, want_grads, strict=True):
            _same(a, w)
        d = dy.copy()
        dx, dg, db = nl.group_norm_backward(d, cache2, out=(d, None, bufs[2]))
        assert dx is d and db is bufs[2]
        for a, w in zip((dx, dg, db), want_grads, strict=True):
            _same(a, w)
        _, c3 = nl.group_norm_forward(x, 2, None, b)
        assert nl.group_norm_backward(dy, c3, out=(None, None, np.empty_like(b)))[1] is None


def _expect(exc, pattern, call, *watched):
    """``call`` raises exc matching pattern and leaves every watched array unchanged."""
    before = [a.copy() for a in watched]
    with pytest.raises(exc, match=pattern):
        call()
    for a, b in zip(watched, before, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_batch_norm_out_buffers_are_rejected_before_any_update(backend):
    x, dy, g, b, rm, rv = _bn_data((4, 6, 5, 7), 1, np.float32)

    def fwd(out, mean=rm, var=rv):
        return lambda: nl.batch_norm_forward(x, g, b, mean, var, True, axis=1, out=out)

    ro = np.empty_like(x)
    ro.flags.writeable = False
    big = np.zeros(x.size + 6, np.float32)  # running_mean and out share memory
    rm_in_big, out_on_rm = big[:6], big[5:5 + x.size].reshape(x.shape)
    rm_in_big[:] = rm
    with use_backend(backend):
        _expect(ValueError, r"out overlaps x \(kept by the cache", fwd(x), rm, rv)
        _expect(TypeError, "out must have dtype float32", fwd(np.empty(x.shape)), rm, rv)
        _expect(ValueError, r"out must have shape \(4, 6, 5, 7\)",
                fwd(np.empty((4, 6, 35), np.float32)), rm, rv)
        _expect(ValueError, "out must be C-contiguous",
                fwd(np.empty(x.shape[::-1], np.float32).T), rm, rv)
        _expect(ValueError, "out must be writeable", fwd(ro), rm, rv)
        _expect(TypeError, "out must be a numpy ndarray", fwd(x.tolist()), rm, rv)
        _expect(ValueError, "out overlaps running_mean", fwd(out_on_rm, rm_in_big), big, rv)
        gamma_buf = np.empty(x.size + 6, np.float32)
        _expect(ValueError, "out overlaps gamma",
                lambda: nl.batch_norm_forward(x, gamma_buf[:6], b, rm, rv, True, axis=1,
                                              out=gamma_buf[5:5 + x.size].reshape(x.shape)), rm, rv)
        _, cache = nl.batch_norm_forward(x, g, b, None, None, True, axis=1)
        good = np.full(x.shape, 7.0, np.float32)

        def bwd(out, d=dy):
            return lambda: nl.batch_norm_backward(d, cache, out=out)

        _expect(TypeError, r"out must be None or a tuple of 3 arrays or None "
                           r"\(dx, dgamma, dbeta\)", bwd(np.empty_like(x)))
        _expect(ValueError, r"out\[0\] \(dx\) overlaps the forward input x", bwd((x, None, None)))
        _expect(ValueError, r"out\[1\] \(dgamma\) must have shape \(6,\)",
                bwd((good, np.empty(5, np.float32), None)), good)
        shared = np.empty(6, np.float32)
        _expect(ValueError, r"out\[2\] \(dbeta\) overlaps out\[1\]",
                bwd((good, shared, shared)), good)
        d = np.zeros(x.size + 1, np.float32)
        _expect(ValueError, r"out\[0\] \(dx\) overlaps dout",  # dout shifted by one value
                bwd((d[1:].reshape(x.shape), None, None), d[:-1].reshape(x.shape)), d)
        _expect(ValueError, r"out\[1\] \(dgamma\) overlaps dout",
                bwd((None, dy.reshape(-1)[:6], None)), dy)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_group_norm_out_buffers_are_rejected(backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8, 5)).astype(np.float64)
    dy = rng.standard_normal(x.shape)
    g = np.ones(8)
    with use_backend(backend):
        _expect(ValueError, r"out overlaps x \(kept by the cache",
                lambda: nl.group_norm_forward(x, 4, g, None, out=x), x)
        _expect(TypeError, "out must have dtype float64",
                lambda: nl.group_norm_forward(x, 4, g, None, out=np.empty(x.shape, np.float32)))
        _expect(ValueError, "out must be C-contiguous",
                lambda: nl.group_norm_forward(x, 4, g, None, out=np.empty((5, 8, 4)).T))
        _, cache = nl.group_norm_forward(x, 4, g, None)
        good = np.full(x.shape, 7.0)
        _expect(ValueError, r"out\[2\] \(dbeta\) must be None",
                lambda: nl.group_norm_backward(dy, cache, out=(good, None, np.empty(8))), good)
        _expect(ValueError, r"out\[0\] \(dx\) overlaps the forward input x",
                lambda: nl.group_norm_backward(dy, cache, out=(x, None, None)), x)
        ro = np.zeros_like(x)
        ro.flags.writeable = False
        _expect(ValueError, r"out\[0\] \(dx\) must be writeable",
                lambda: nl.group_norm_backward(dy, cache, out=(ro, None, None)))
