"""LayerNorm / RMSNorm forward and backward with out= buffers.

Expected values: the same call without ``out`` on the same backend (bit for bit: the same
arithmetic writes into a caller's buffer instead of a new one); both backends.
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab._backend import use_backend

BACKENDS = ["numba", "numpy"]


def _data(shape=(6, 4, 32), dtype=np.float32):
    rng = np.random.default_rng(9)
    x, dy = (rng.standard_normal(shape).astype(dtype) + 1 for _ in range(2))
    g, b = (rng.standard_normal(shape[-1]).astype(dtype) for _ in range(2))
    return x, dy, g, b


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_out_buffers_match_and_dx_may_be_dout(backend, dtype):
    x, dy, g, b = _data(dtype=dtype)
    with use_backend(backend):
        want, cache = nl.layer_norm_forward(x, g, b)
        want_grads = nl.layer_norm_backward(dy, cache)
        buf = np.empty_like(x)
        got, cache2 = nl.layer_norm_forward(x, g, b, out=buf)
        assert got is buf and cache2.x is x
        _same(got, want)
        bufs = (np.empty_like(x), np.empty_like(g), np.empty_like(b))
        grads = nl.layer_norm_backward(dy, cache2, out=bufs)
        assert all(r is o for r, o in zip(grads, bufs, strict=True))
        for a, w in zip(grads, want_grads, strict=True):
            _same(a, w)
        d = dy.copy()  # dx in place of dout; the parameter gradients newly allocated
        dx, dg, db = nl.layer_norm_backward(d, cache2, out=(d, None, None))
        assert dx is d
        for a, w in zip((dx, dg, db), want_grads, strict=True):
            _same(a, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_out_buffers_match(backend):
    x, dy, g, _ = _data()
    with use_backend(backend):
        want, cache = nl.rms_norm_forward(x, g, offset=0.5)
        want_grads = nl.rms_norm_backward(dy, cache)
        got, cache2 = nl.rms_norm_forward(x, g, offset=0.5, out=np.empty_like(x))
        _same(got, want)
        d = dy.copy()
        dx, dw = nl.rms_norm_backward(d, cache2, out=(d, np.empty_like(g)))
        assert dx is d
        _same(dx, want_grads[0])
        _same(dw, want_grads[1])
        _, c3 = nl.rms_norm_forward(x, None)
        assert nl.rms_norm_backward(dy, c3, out=(np.empty_like(x), None))[1] is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_norm_out_buffers_are_rejected(backend):
    x, dy, g, b = _data()
    with use_backend(backend):
        with pytest.raises(ValueError, match=r"out overlaps x \(kept by the cache"):
            nl.layer_norm_forward(x, g, b, out=x)
        with pytest.raises(TypeError, match="out must have dtype float32"):
            nl.layer_norm_forward(x, g, b, out=np.empty(x.shape))
        with pytest.raises(ValueError, match="out must be C-contiguous"):
            nl.rms_norm_forward(x, g, out=np.empty(x.shape[::-1], np.float32).T)
        _, cache = nl.layer_norm_forward(x, g, b)
        with pytest.raises(TypeError, match=r"out must be None or a tuple of 3 arrays or None "
                                             r"\(dx, dgamma, dbeta\)"):
            nl.layer_norm_backward(dy, cache, out=np.empty_like(x))
        with pytest.raises(ValueError, match=r"out\[0\] \(dx\) overlaps the forward input x"):
            nl.layer_norm_backward(dy, cache, out=(x, None, None))
        with pytest.raises(ValueError, match=r"out\[1\] \(dgamma\) must have shape \(32,\)"):
            nl.layer_norm_backward(dy, cache, out=(None, np.empty(31, np.float32), None))
        shared = np.empty(32, np.float32)
        with pytest.raises(ValueError, match=r"out\[2\] \(dbeta\) overlaps out\[1\]"):
            nl.layer_norm_backward(dy, cache, out=(None, shared, shared))
        _, c2 = nl.rms_norm_forward(x, None)
        with pytest.raises(ValueError, match=r"out\[1\] \(dweight\) must be None"):
            nl.rms_norm_backward(dy, c2, out=(None, np.empty(32, np.float32)))
