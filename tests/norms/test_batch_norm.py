"""BatchNorm: gradient checks in training and eval, the listing's running statistics.

Tolerances: gradient checks tol 1e-6 (float64 central differences, h = 1e-6: a correct
backward scores ~1e-9, a wrong term > 1e-3); float64 identities 1e-12 (ulps of O(1) values).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab import batch_norm_backward, batch_norm_forward, gradcheck

GRAD_TOL = 1e-6


def listing_batch_norm(x, gamma, beta, running_mean, running_var, training, momentum, eps):
    """Chapter Listing 16.3's BatchNorm forward on (N, C), the independent reference."""
    if training:
        mean, var = x.mean(axis=0), x.var(axis=0)
        running_mean *= momentum
        running_mean += (1 - momentum) * mean
        running_var *= momentum
        running_var += (1 - momentum) * var
    else:
        mean, var = running_mean, running_var
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


CASES = [((6, 4), -1), ((3, 5, 4), -1), ((4, 3, 2, 2), 1), ((2, 3, 2, 3), -1)]


@pytest.mark.parametrize(("shape", "axis"), CASES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_gradcheck_full(rng, shape, axis, training, affine):
    c = shape[axis]
    x = rng.standard_normal(shape)
    g = rng.standard_normal(c) if affine else None
    b = rng.standard_normal(c) if affine else None
    rm, rv = rng.standard_normal(c), rng.random(c) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()

    def fwd(x, g, b, rm, rv):
        return batch_norm_forward(x, g, b, rm, rv, training, 0.8, axis=axis)

    err = gradcheck(fwd, batch_norm_backward, (x, g, b, rm, rv), rng=rng, tol=GRAD_TOL)
    assert err < GRAD_TOL
    # gradcheck works on copies: the caller's running statistics are untouched
    np.testing.assert_array_equal(rm, rm0, strict=True)
    np.testing.assert_array_equal(rv, rv0, strict=True)


def test_gradcheck_bias_only_without_running_stats(rng):
    x, b = rng.standard_normal((5, 3)), rng.standard_normal(3)

    def fwd(x, b):
        return batch_norm_forward(x, None, b, None, None, True)

    assert gradcheck(fwd, batch_norm_backward, (x, b), rng=rng, tol=GRAD_TOL) < GRAD_TOL


@pytest.mark.parametrize("training", [True, False])
def test_matches_listing_16_3(rng, training):
    x, g, b = rng.standard_normal((8, 5)) * 2 + 1, rng.standard_normal(5), rng.standard_normal(5)
    rm, rv = rng.standard_normal(5), rng.random(5) + 0.5
    lrm, lrv = rm.copy(), rv.copy()
    want = listing_batch_norm(x, g, b, lrm, lrv, training, 0.9, 1e-5)
    out, _ = batch_norm_forward(x, g, b, rm, rv, training)
    # same formulas, different summation order: float64 ulps
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rm, lrm, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rv, lrv, rtol=0, atol=1e-12)


def test_unbiased_running_var_and_axis1(rng):
    x = rng.standard_normal((3, 4, 2, 5))  # (N, C, H, W), n = 30 values per channel
    rm, rv = np.zeros(4), np.ones(4)
    batch_norm_forward(x, None, None, rm, rv, True, 0.75, axis=1, unbiased_running_var=True)
    per_c = np.moveaxis(x, 1, 0).reshape(4, -1)
    np.testing.assert_allclose(rm, 0.25 * per_c.mean(1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rv, 0.75 + 0.25 * per_c.var(1, ddof=1), rtol=0, atol=1e-12)


def test_eval_uses_running_statistics(rng):
    x = rng.standard_normal((4, 3)) + 7.0
    rm, rv = np.array([1.0, -2.0, 0.5]), np.array([4.0, 0.25, 1.0])
    out, cache = batch_norm_forward(x, None, None, rm, rv, False, eps=1e-5)
    np.testing.assert_allclose(out, (x - rm) / np.sqrt(rv + 1e-5), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(rm, [1.0, -2.0, 0.5], strict=True)  # eval does not update
    # eval backward: the statistics are constants, so dx = dout * rstd
    dout = rng.standard_normal(x.shape)
    dx, _, _ = batch_norm_backward(dout, cache)
    np.testing.assert_allclose(dx, dout / np.sqrt(rv + 1e-5), rtol=0, atol=1e-12)
    rm[:] = 100.0  # a later update must not leak into this call's cache
    dx2, _, _ = batch_norm_backward(dout, cache)
    np.testing.assert_array_equal(dx, dx2, strict=True)


def test_one_value_per_feature_rejected_state_unchanged():
    rm, rv = np.zeros(3), np.ones(3)
    with pytest.raises(ValueError, match="more than one value per feature"):
        batch_norm_forward(np.ones((1, 3)), None, None, rm, rv, True)
    np.testing.assert_array_equal(rm, np.zeros(3), strict=True)
    np.testing.assert_array_equal(rv, np.ones(3), strict=True)
    out, _ = batch_norm_forward(np.ones((1, 3)), None, None, rm, rv, False)  # eval is fine
    assert out.shape == (1, 3)


def test_empty_batch():
    rm, rv = np.full(3, 0.5), np.full(3, 2.0)
    out, cache = batch_norm_forward(np.zeros((0, 3)), np.ones(3), np.ones(3), rm, rv, True)
    assert out.shape == (0, 3)
    np.testing.assert_array_equal(rm, np.full(3, 0.5), strict=True)  # nothing to learn from
    dx, dg, db = batch_norm_backward(np.zeros((0, 3)), cache)
    assert dx.shape == (0, 3)
    np.testing.assert_array_equal(dg, np.zeros(3), strict=True)
    np.testing.assert_array_equal(db, np.zeros(3), strict=True)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_round_trip(rng, dtype):
    x = rng.standard_normal((16, 4)).astype(dtype)
    g = np.ones(4, dtype)
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    out, cache = batch_norm_forward(x, g, None, rm, rv, True)
    assert out.dtype == np.dtype(dtype) and cache.rstd.dtype == np.float32
    ref = (x.astype(np.float64) - x.astype(np.float64).mean(0)) / np.sqrt(
        x.astype(np.float64).var(0) + 1e-5)
    # float32 compute, one rounding to the output format: 4 eps of the format for |out| < 4
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0,
                               atol=4 * float(ml_dtypes.finfo(dtype).eps))
    dx, dg, db = batch_norm_backward(np.ones(x.shape, dtype), cache)
    assert dx.dtype == dg.dtype == np.dtype(dtype) and db is None


def test_cache_is_per_feature(rng):
    x = rng.standard_normal((4, 5, 3))
    _, cache = batch_norm_forward(x, None, None, None, None, True)
    assert cache.x is x and cache.mean.shape == cache.rstd.shape == (3,) and cache.axis == 2
