"""LayerNorm: gradient checks, the chapter's invariants, numerics and dtypes.

Tolerances: float64 gradient checks use tol 1e-6 (central differences with h = 1e-6 have
truncation error ~h^2 and rounding error ~1e-16 / h = 1e-10 relative; a wrong backward
term scores > 1e-3). Float64 identities use 1e-12 (a few ulps of O(1) values summed over
rows of at most ~100 terms).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab import gradcheck, layer_norm_backward, layer_norm_forward

GRAD_TOL = 1e-6


def listing_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float):
    """Chapter Listing 16.1's forward (the one-line formula), for 1 normalised dim."""
    mean = x.mean(axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize(
    ("shape", "k"), [((4, 7), 1), ((3, 4, 5), 1), ((3, 4, 5), 2), ((2, 3, 2, 4), 3)]
)
@pytest.mark.parametrize("affine", ["both", "gain_only", "bias_only", "none"])
def test_gradcheck_full(rng, shape, k, affine):
    x = rng.standard_normal(shape)
    feat = shape[len(shape) - k :]
    gamma = rng.standard_normal(feat) if affine in ("both", "gain_only") else None
    beta = rng.standard_normal(feat) if affine in ("both", "bias_only") else None

    def fwd(x, gamma, beta):
        return layer_norm_forward(x, gamma, beta, 1e-5, normalized_ndim=k)

    err = gradcheck(fwd, layer_norm_backward, (x, gamma, beta), rng=rng, tol=GRAD_TOL)
    assert err < GRAD_TOL


def test_gradcheck_directional_large(rng):
    x = rng.standard_normal((16, 64))
    g, b = rng.standard_normal(64), rng.standard_normal(64)
    err = gradcheck(layer_norm_forward, layer_norm_backward, (x, g, b), rng=rng,
                    mode="directional", num_directions=6, tol=GRAD_TOL)
    assert err < GRAD_TOL


def test_matches_listing_16_1(rng):
    x, g, b = rng.standard_normal((5, 9)), rng.standard_normal(9), rng.standard_normal(9)
    out, _ = layer_norm_forward(x, g, b, 1e-5)
    # same formula, different summation order: a few float64 ulps
    np.testing.assert_allclose(out, listing_layer_norm(x, g, b, 1e-5), rtol=0, atol=1e-12)


def test_default_normalized_ndim_follows_gamma_then_beta(rng):
    x = rng.standard_normal((2, 3, 4))
    out_g, _ = layer_norm_forward(x, np.ones((3, 4)), None)
    out_b, _ = layer_norm_forward(x, None, np.zeros((3, 4)))
    out_1, _ = layer_norm_forward(x, None, None)
    rows = x.reshape(2, 12)
    want2 = ((rows - rows.mean(1, keepdims=True)) / np.sqrt(rows.var(1, keepdims=True) + 1e-5))
    np.testing.assert_allclose(out_g, want2.reshape(x.shape), atol=1e-12)  # float64 ulps
    np.testing.assert_allclose(out_b, want2.reshape(x.shape), atol=1e-12)
    np.testing.assert_allclose(out_1, listing_layer_norm(x, 1.0, 0.0, 1e-5), atol=1e-12)


def test_dx_rows_sum_to_zero(rng):
    x, g = rng.standard_normal((6, 10)) * 3 + 1, rng.standard_normal(10)
    _, cache = layer_norm_forward(x, g, None)
    dx, _, _ = layer_norm_backward(rng.standard_normal(x.shape), cache)
    # the mean direction is removed exactly up to rounding of ~10 O(1) terms
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-12)


def test_shift_invariance(rng):
    x, g, b = rng.standard_normal((4, 8)), rng.standard_normal(8), rng.standard_normal(8)
    shift = rng.standard_normal((4, 1)) * 5
    out1, _ = layer_norm_forward(x, g, b)
    out2, _ = layer_norm_forward(x + shift, g, b)
    # x + shift rounds at ulp(5) ~ 1e-15, amplified by 1/std ~ 1
    np.testing.assert_allclose(out1, out2, atol=1e-12)


@pytest.mark.parametrize(("offset", "scale"), [(2000.0, 1.0), (100.0, 0.01)])
def test_float32_large_offset_matches_float64(rng, offset, scale):
    x32 = (rng.standard_normal((8, 256)) * scale + offset).astype(np.float32)
    out32, _ = layer_norm_forward(x32, None, None)
    ref, _ = layer_norm_forward(x32.astype(np.float64), None, None)
    # float32 accuracy of this problem: the stored mean of a row is exact to half an ulp of
    # the offset, an error amplified by 1/std; allow 4 such ulps (E[x^2]-E[x]^2 in float32
    # would lose every digit here: errors of order 1).
    tol = 4 * np.spacing(np.float32(offset)) / scale
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_round_trip(rng, dtype):
    x = rng.standard_normal((4, 32)).astype(dtype)
    g = (1 + 0.1 * rng.standard_normal(32)).astype(dtype)
    b = (0.1 * rng.standard_normal(32)).astype(dtype)
    out, cache = layer_norm_forward(x, g, b)
    assert out.dtype == np.dtype(dtype) and cache.rstd.dtype == np.float32
    ref, _ = layer_norm_forward(x.astype(np.float64), g.astype(np.float64),
                                b.astype(np.float64))
    # computed in float32, rounded once to the output format: within one ulp of |out| <= ~4
    ulp = float(ml_dtypes.finfo(dtype).eps) * 4
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0, atol=ulp)
    dx, dg, db = layer_norm_backward(np.ones(x.shape, dtype), cache)
    assert dx.dtype == dg.dtype == db.dtype == np.dtype(dtype)


def test_mixed_parameter_dtype_grads(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    g, b = np.ones(5, np.float64), np.zeros(5, np.float16)
    out, cache = layer_norm_forward(x, g, b)
    dx, dg, db = layer_norm_backward(np.ones_like(x), cache)
    assert (out.dtype, dx.dtype, dg.dtype, db.dtype) == (
        np.float32, np.float32, np.float64, np.float16)


def test_nan_row_stays_in_its_row(rng):
    x = rng.standard_normal((4, 6))
    x[1, 2] = np.nan
    out, cache = layer_norm_forward(x, np.ones(6), np.zeros(6))
    assert np.isnan(out[1]).all() and np.isfinite(np.delete(out, 1, axis=0)).all()
    dx, _, _ = layer_norm_backward(np.ones_like(x), cache)
    assert np.isfinite(np.delete(dx, 1, axis=0)).all()


def test_inf_row_stays_in_its_row(rng):
    x = rng.standard_normal((3, 5))
    x[0, 0] = np.inf
    # no errstate here: the library documents NaN for such a row and must not warn
    # (warnings are errors in this suite)
    out, cache = layer_norm_forward(x, None, None)
    assert np.isfinite(out[1:]).all() and not np.isfinite(out[0]).any()
    dx, _, _ = layer_norm_backward(np.ones_like(x), cache)
    assert np.isfinite(dx[1:]).all()


def test_empty_batch(rng):
    x = np.zeros((0, 7))
    out, cache = layer_norm_forward(x, np.ones(7), np.ones(7))
    assert out.shape == (0, 7)
    dx, dg, db = layer_norm_backward(np.zeros((0, 7)), cache)
    assert dx.shape == (0, 7)
    np.testing.assert_array_equal(dg, np.zeros(7), strict=True)
    np.testing.assert_array_equal(db, np.zeros(7), strict=True)


def test_cache_holds_references_and_row_stats(rng):
    x, g = rng.standard_normal((6, 5, 4)), rng.standard_normal(4)
    _, cache = layer_norm_forward(x, g, None)
    assert cache.x is x and cache.gamma is g
    assert cache.mean.shape == cache.rstd.shape == (6, 5)
    full = [f for f in cache if isinstance(f, np.ndarray) and f.size >= x.size and f is not x]
    assert full == []


def test_none_parameters_give_none_grads(rng):
    _, cache = layer_norm_forward(rng.standard_normal((2, 3)), None, None)
    dx, dg, db = layer_norm_backward(np.ones((2, 3)), cache)
    assert dg is None and db is None and dx.shape == (2, 3)
