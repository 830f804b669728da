"""Inverted dropout forward and backward with out= buffers.

Expected values: the same call without ``out`` on the same backend with a generator of the
same seed (bit for bit, mask included); both backends, and a NumPy-scalar p, which changes
the result dtype and is left to the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab._backend import use_backend

BACKENDS = ["numba", "numpy"]


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [0.3, np.float64(0.3)])
def test_dropout_out_buffers_match_and_may_be_the_input(backend, p):
    x = np.random.default_rng(1).standard_normal((7, 33)).astype(np.float32)
    dy = np.random.default_rng(2).standard_normal((7, 33)).astype(np.float32)
    with use_backend(backend):
        want, want_keep = nl.inverted_dropout(x, p, np.random.default_rng(5))
        want_dx = nl.inverted_dropout_backward(dy, want_keep, p)
        bufs = (np.empty(x.shape, want.dtype), np.empty(x.shape, np.bool_))
        got, keep = nl.inverted_dropout(x, p, np.random.default_rng(5), out=bufs)
        assert got is bufs[0] and keep is bufs[1]
        _same(got, want)
        _same(keep, want_keep)
        if want.dtype == x.dtype:  # in place of x; the mask newly allocated
            xi = x.copy()
            got, keep = nl.inverted_dropout(xi, p, np.random.default_rng(5), out=(xi, None))
            assert got is xi
            _same(got, want)
            _same(keep, want_keep)
        buf = np.empty(x.shape, want_dx.dtype)
        assert nl.inverted_dropout_backward(dy, want_keep, p, out=buf) is buf
        _same(buf, want_dx)
        d = dy.copy()
        if want_dx.dtype == d.dtype:
            assert nl.inverted_dropout_backward(d, want_keep, p, out=d) is d
            _same(d, want_dx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_dropout_out_buffers_are_rejected_before_the_draw(backend):
    x = np.ones((4, 6), np.float32)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    with use_backend(backend):
        with pytest.raises(TypeError, match=r"out must be None or a tuple of 2 arrays or None "
                                            r"\(out, keep\)"):
            nl.inverted_dropout(x, 0.5, rng, out=np.empty_like(x))
        with pytest.raises(TypeError, match=r"out\[0\] \(out\) must have dtype float32"):
            nl.inverted_dropout(x, 0.5, rng, out=(np.empty(x.shape), None))
        with pytest.raises(TypeError, match=r"out\[1\] \(keep\) must have dtype bool"):
            nl.inverted_dropout(x, 0.5, rng, out=(None, np.empty(x.shape, np.uint8)))
        with pytest.raises(ValueError, match=r"out\[1\] \(keep\) must have shape \(4, 6\)"):
            nl.inverted_dropout(x, 0.5, rng, out=(None, np.empty((4, 5), np.bool_)))
        with pytest.raises(ValueError, match=r"out\[0\] \(out\) must be C-contiguous"):
            nl.inverted_dropout(x, 0.5, rng, out=(np.empty((6, 4), np.float32).T, None))
        big = np.ones((5, 6), np.float32)
        with pytest.raises(ValueError, match=r"out\[0\] \(out\) overlaps x"):
            nl.inverted_dropout(big[:4], 0.5, rng, out=(big[1:], None))
        raw = np.zeros(24, np.float32)  # the mask on x's bytes
        with pytest.raises(ValueError, match=r"out\[1\] \(keep\) overlaps x"):
            nl.inverted_dropout(raw.reshape(4, 6), 0.5, rng,
                                out=(None, raw.view(np.bool_)[:24].reshape(4, 6)))
        assert rng.bit_generator.state == state  # nothing drawn
        _, keep = nl.inverted_dropout(x, 0.5, rng)
        with pytest.raises(TypeError, match="out must have dtype float32"):
            nl.inverted_dropout_backward(x, keep, 0.5, out=np.empty((4, 6)))
        ro = np.empty_like(x)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="out must be writeable"):
            nl.inverted_dropout_backward(x, keep, 0.5, out=ro)
        raw = np.zeros(96, np.uint8)  # dx's buffer holds the mask's bytes
        on_keep = raw[:24].view(np.bool_).reshape(4, 6)
        on_keep[...] = keep
        with pytest.raises(ValueError, match="out overlaps keep"):
            nl.inverted_dropout_backward(x, on_keep, 0.5, out=raw.view(np.float32).reshape(4, 6))
        np.testing.assert_array_equal(on_keep, keep)
