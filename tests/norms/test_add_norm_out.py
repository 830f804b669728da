"""Fused residual add + LayerNorm / RMSNorm with out= buffers.

Expected values: the same call without ``out`` on the same backend (bit for bit: the same
arithmetic writes into a caller's buffer instead of a new one); both backends, and a mixed
dtype pair (float32 x, float64 residual) that the kernels leave to the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab._backend import use_backend

BACKENDS = ["numba", "numpy"]


def _data(shape=(5, 3, 24), dtype=np.float32):
    rng = np.random.default_rng(14)
    x, r, dy, dr = (rng.standard_normal(shape).astype(dtype) + 0.5 for _ in range(4))
    g, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    return x, r, dy, dr, g, b


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_layer_norm_out_buffers_match(backend, dtype):
    x, r, dy, dr, g, b = _data(dtype=dtype)
    with use_backend(backend):
        want_y, want_s, cache = nl.add_layer_norm_forward(x, r, g, b)
        want_grads = nl.add_layer_norm_backward(dy, dr, cache)
        bufs = (np.empty_like(x), np.empty_like(x))
        y, s, cache2 = nl.add_layer_norm_forward(x, r, g, b, out=bufs)
        assert y is bufs[0] and s is bufs[1] and cache2.x is bufs[1]
        _same(y, want_y)
        _same(s, want_s)
        gbufs = (np.empty_like(x), np.empty_like(g), np.empty_like(b))
        grads = nl.add_layer_norm_backward(dy, dr, cache2, out=gbufs)
        assert all(a is o for a, o in zip(grads, gbufs, strict=True))
        for a, w in zip(grads, want_grads, strict=True):
            _same(a, w)
        d = dy.copy()  # dsum in place of dout; parameter gradients newly allocated
        got = nl.add_layer_norm_backward(d, dr, cache2, out=(d, None, None))
        assert got[0] is d
        for a, w in zip(got, want_grads, strict=True):
            _same(a, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_rms_norm_out_buffers_match_and_may_alias_the_inputs(backend):
    x, r, dy, dr, g, _ = _data()
    with use_backend(backend):
        want_y, want_s, cache = nl.add_rms_norm_forward(x, r, g, offset=0.5)
        want_grads = nl.add_rms_norm_backward(dy, dr, cache)
        xi, ri = x.copy(), r.copy()  # out into residual, the new stream into x
        y, s, cache2 = nl.add_rms_norm_forward(xi, ri, g, offset=0.5, out=(ri, xi))
        assert y is ri and s is xi
        _same(y, want_y)
        _same(s, want_s)
        xi = x.copy()  # only the stream, in place of x; out newly allocated
        y, s, _ = nl.add_rms_norm_forward(xi, r, g, offset=0.5, out=(None, xi))
        assert s is xi
        _same(y, want_y)
        _same(s, want_s)
        d = dy.copy()
        dsum, dw = nl.add_rms_norm_backward(d, dr, cache2, out=(d, np.empty_like(g)))
        assert dsum is d
        _same(dsum, want_grads[0])
        _same(dw, want_grads[1])
        _, _, c3 = nl.add_rms_norm_forward(x, r, None)
        assert nl.add_rms_norm_backward(dy, None, c3, out=(np.empty_like(x), None))[1] is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_norm_out_with_mixed_dtypes_matches(backend):
    x, r, _, _, g, b = _data()
    r64 = r.astype(np.float64)  # the new stream is float64, out stays float32
    with use_backend(backend):
        want_y, want_s, _ = nl.add_layer_norm_forward(x, r64, g, b)
        bufs = (np.empty_like(x), np.empty(x.shape, np.float64))
        y, s, _ = nl.add_layer_norm_forward(x, r64, g, b, out=bufs)
        _same(y, want_y)
        _same(s, want_s)
        with pytest.raises(TypeError, match=r"out\[1\] \(new_residual\) must have dtype "
                                            r"float64"):
            nl.add_layer_norm_forward(x, r64, g, b, out=(None, np.empty_like(x)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_add_norm_out_buffers_are_rejected_before_writing(backend):
    x, r, dy, dr, g, b = _data()
    x0 = x.copy()
    with use_backend(backend):
        with pytest.raises(TypeError, match=r"out must be None or a tuple of 2 arrays or None "
                                            r"\(out, new_residual\)"):
            nl.add_layer_norm_forward(x, r, g, b, out=np.empty_like(x))
        with pytest.raises(TypeError, match=r"out\[0\] \(out\) must have dtype float32"):
            nl.add_layer_norm_forward(x, r, g, b, out=(np.empty(x.shape), None))
        with pytest.raises(ValueError, match=r"out\[0\] \(out\) must have shape \(5, 3, 24\)"):
            nl.add_rms_norm_forward(x, r, g, out=(np.empty((5, 3, 23), np.float32), None))
        with pytest.raises(ValueError, match=r"out\[1\] \(new_residual\) must be "
                                             r"C-contiguous"):
            nl.add_rms_norm_forward(x, r, g, out=(None, np.empty((24, 3, 5), np.float32).T))
        ro = np.empty_like(x)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match=r"out\[1\] \(new_residual\) must be writeable"):
            nl.add_rms_norm_forward(x, r, g, out=(None, ro))
        with pytest.raises(ValueError, match=r"out\[1\] \(new_residual\) overlaps out\[0\]"):
            nl.add_layer_norm_forward(x, r, g, b, out=(x, x))
        big = np.empty((6, 3, 24), np.float32)  # x and out overlap in part
        xv = big[:5]
        xv[...] = x
        with pytest.raises(ValueError, match=r"out\[0\] \(out\) overlaps x; pass x itself"):
            nl.add_layer_norm_forward(xv, r, g, b, out=(big[1:], None))
        with pytest.raises(ValueError, match=r"out\[1\] \(new_residual\) overlaps residual"):
            nl.add_layer_norm_forward(x, xv, g, b, out=(None, big[1:]))
        w = np.ones(24, np.float32)  # out on the parameter's memory
        with pytest.raises(ValueError, match=r"out\[0\] \(out\) overlaps weight"):
            nl.add_rms_norm_forward(x[0, :1], r[0, :1], w, out=(w.reshape(1, 24), None))
        np.testing.assert_array_equal(x, x0)
        _, s, cache = nl.add_layer_norm_forward(x, r, g, b)
        with pytest.raises(TypeError, match=r"out must be None or a tuple of 3 arrays or None "
                                            r"\(dx, dgamma, dbeta\)"):
            nl.add_layer_norm_backward(dy, dr, cache, out=(None, None))
        with pytest.raises(ValueError, match=r"out\[0\] \(dx\) overlaps dresidual"):
            nl.add_layer_norm_backward(dy, dr, cache, out=(dr, None, None))
        with pytest.raises(ValueError, match=r"out\[0\] \(dx\) overlaps the forward input x"):
            nl.add_layer_norm_backward(dy, dr, cache, out=(s, None, None))
        _, _, c2 = nl.add_rms_norm_forward(x, r, None)
        with pytest.raises(ValueError, match=r"out\[1\] \(dweight\) must be None"):
            nl.add_rms_norm_backward(dy, dr, c2, out=(None, np.empty(24, np.float32)))
        dr0 = dr.copy()
        with pytest.raises(ValueError, match=r"out\[1\] \(dweight\) overlaps dresidual"):
            _, _, c3 = nl.add_rms_norm_forward(x, r, g)
            nl.add_rms_norm_backward(dy, dr, c3, out=(None, dr[0, 0]))
        np.testing.assert_array_equal(dr, dr0)
