"""Inverted dropout: bit-equality with Listing 16.3, the mean, the mask, the backward.

Tolerances: listing equality is exact (same draws, same operations). The mean test uses a
5-sigma bound from the central limit theorem: each output is x/(1-p) with probability 1-p,
else 0, so with x = 1 its variance is p/(1-p) and the sample mean of n values has standard
deviation sqrt(p/((1-p) n)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab import gradcheck, inverted_dropout, inverted_dropout_backward


def listing_inverted_dropout(x, drop_probability, rng):
    """Chapter Listing 16.3, verbatim in behaviour."""
    if not 0 <= drop_probability < 1:
        raise ValueError("drop_probability must be in [0, 1)")
    keep = rng.random(x.shape) >= drop_probability
    return x * keep / (1 - drop_probability), keep


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, np.float32(0.3)])
def test_bitwise_equal_to_listing(rng, dtype, p):
    x = rng.standard_normal((7, 5, 3)).astype(dtype)
    out, keep = inverted_dropout(x, p, np.random.default_rng(1234))
    want, want_keep = listing_inverted_dropout(x, p, np.random.default_rng(1234))
    np.testing.assert_array_equal(keep, want_keep, strict=True)
    np.testing.assert_array_equal(out, want, strict=True)  # same dtype, same bits


def test_rng_stream_is_advanced_like_the_listing():
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    inverted_dropout(np.ones(10), 0.5, r1)
    listing_inverted_dropout(np.ones(10), 0.5, r2)
    assert r1.random() == r2.random()


def test_preserves_the_mean():
    n, p = 200_000, 0.3
    out, keep = inverted_dropout(np.ones(n), p, np.random.default_rng(0))
    sigma = math.sqrt(p / ((1 - p) * n))  # CLT standard deviation of the sample mean
    assert abs(out.mean() - 1.0) < 5 * sigma
    # fraction kept ~ Binomial(n, 1-p)/n: standard deviation sqrt(p(1-p)/n)
    assert abs(keep.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert set(np.unique(out).tolist()) == {0.0, 1.0 / (1 - p)}


def test_p_zero_is_identity(rng):
    x = rng.standard_normal((4, 4))
    out, keep = inverted_dropout(x, 0.0, rng)
    assert keep.all()
    np.testing.assert_array_equal(out, x, strict=True)


def test_backward_uses_mask_and_scale(rng):
    dout = rng.standard_normal((5, 6))
    keep = rng.random((5, 6)) >= 0.4
    dx = inverted_dropout_backward(dout, keep, 0.4)
    np.testing.assert_array_equal(dx, np.where(keep, dout / 0.6, 0.0), strict=False)
    # a fixed seed makes the forward deterministic, so it can be gradient-checked
    x = rng.standard_normal((3, 4))

    def fwd(x):
        return inverted_dropout(x, 0.25, np.random.default_rng(99))

    def bwd(dout, keep):
        return (inverted_dropout_backward(dout, keep, 0.25),)

    # linear map: central differences are exact up to rounding (tol 1e-6, see other modules)
    assert gradcheck(fwd, bwd, (x,), rng=rng, tol=1e-6) < 1e-6


def test_zero_dim_input():
    out, keep = inverted_dropout(np.array(2.0), 0.5, np.random.default_rng(3))
    want, want_keep = listing_inverted_dropout(np.array(2.0), 0.5, np.random.default_rng(3))
    assert out == want and keep == want_keep
    assert inverted_dropout_backward(np.array(1.0), keep, 0.5).shape == ()
