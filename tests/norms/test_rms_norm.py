"""RMSNorm: gradient checks (offset, no weight), invariances, listing equality, dtypes.

Tolerances: float64 gradient checks use tol 1e-6 (central differences with h = 1e-6: error
~1e-10 relative for a correct backward, > 1e-3 for a wrong term); float64 identities use
1e-12 (a few ulps of O(1) values).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab import gradcheck, rms_norm_backward, rms_norm_forward

GRAD_TOL = 1e-6


@pytest.mark.parametrize(
    ("shape", "k"), [((5, 6), 1), ((3, 4, 5), 1), ((3, 4, 5), 2), ((2, 2, 3, 4), 2)]
)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradcheck_full(rng, shape, k, offset, with_weight):
    x = rng.standard_normal(shape)
    w = rng.standard_normal(shape[len(shape) - k :]) if with_weight else None

    def fwd(x, w):
        return rms_norm_forward(x, w, 1e-8, offset=offset, normalized_ndim=k)

    assert gradcheck(fwd, rms_norm_backward, (x, w), rng=rng, tol=GRAD_TOL) < GRAD_TOL


def test_matches_listing_16_2_and_offset(rng):
    x, w = rng.standard_normal((4, 8)), rng.standard_normal(8)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    want = x / np.sqrt(ms + 1e-8) * w  # Listing 16.2's forward
    out, _ = rms_norm_forward(x, w)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)  # float64 ulps
    out1, _ = rms_norm_forward(x, w, offset=1.0)
    np.testing.assert_allclose(out1, x / np.sqrt(ms + 1e-8) * (1.0 + w), rtol=0, atol=1e-12)


def test_scaling_one_row_changes_nothing(rng):
    x, w = rng.standard_normal((3, 16)), rng.standard_normal(16)
    x2 = x.copy()
    x2[1] *= 37.5
    # eps -> 0 regime: with mean(x^2) ~ 1 the eps term moves the result by ~eps/2 = 5e-9
    out1, _ = rms_norm_forward(x, w, 1e-8)
    out2, _ = rms_norm_forward(x2, w, 1e-8)
    np.testing.assert_allclose(out1, out2, rtol=0, atol=1e-7)


def test_dx_orthogonal_to_x_when_dout_is_out_direction(rng):
    # scale invariance means <dx, x> = 0 for any dout (the RMS removes the radial direction)
    x, w = rng.standard_normal((5, 12)), rng.standard_normal(12)
    _, cache = rms_norm_forward(x, w, 1e-300)  # eps negligible: invariance is exact
    dx, _ = rms_norm_backward(rng.standard_normal(x.shape), cache)
    np.testing.assert_allclose(np.sum(dx * x, axis=-1), 0.0, atol=1e-12)  # float64 ulps


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_round_trip(rng, dtype):
    x = rng.standard_normal((3, 24)).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(24)).astype(dtype)
    out, cache = rms_norm_forward(x, w)
    ref, _ = rms_norm_forward(x.astype(np.float64), w.astype(np.float64))
    assert out.dtype == np.dtype(dtype) and cache.rstd.dtype == np.float32
    # computed in float32, rounded once: one output-format eps times |out| <= ~4
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0,
                               atol=4 * float(ml_dtypes.finfo(dtype).eps))
    dx, dw = rms_norm_backward(np.ones(x.shape, dtype), cache)
    assert dx.dtype == dw.dtype == np.dtype(dtype)


def test_nan_row_and_empty_batch(rng):
    x = rng.standard_normal((3, 4))
    x[2, 1] = np.nan
    out, cache = rms_norm_forward(x, np.ones(4))
    assert np.isnan(out[2]).all() and np.isfinite(out[:2]).all()
    dx, _ = rms_norm_backward(np.ones_like(x), cache)
    assert np.isfinite(dx[:2]).all()
    out, cache = rms_norm_forward(np.zeros((0, 4)), np.ones(4))
    dx, dw = rms_norm_backward(np.zeros((0, 4)), cache)
    assert out.shape == dx.shape == (0, 4)
    np.testing.assert_array_equal(dw, np.zeros(4), strict=True)


def test_inf_row_and_float32_overflow_stay_in_their_row(rng):
    x = rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16)
    x[0, 1] = np.inf
    x[2, 0] = 1e30  # finite in bfloat16, but its square overflows the float32 statistic
    out, cache = rms_norm_forward(x, None)  # no NumPy warning (warnings are errors here)
    assert np.isfinite(out[1].astype(np.float32)).all()
    assert not np.isfinite(out[0].astype(np.float32)).all()
    dx, _ = rms_norm_backward(np.ones(x.shape, x.dtype), cache)
    assert np.isfinite(dx[1].astype(np.float32)).all()


def test_cache_is_small(rng):
    x = rng.standard_normal((7, 3, 5))
    _, cache = rms_norm_forward(x, None)
    assert cache.x is x and cache.rstd.shape == (7, 3) and cache.weight is None
    _, dw = rms_norm_backward(np.ones_like(x), cache)
    assert dw is None
