"""GroupNorm: gradient checks, GroupNorm(1 group) = LayerNorm over (C, *S), dtypes.

Tolerances: gradient checks tol 1e-6 (float64 central differences, h = 1e-6); float64
identities 1e-12 (ulps of O(1) values summed over at most a few dozen terms).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab import gradcheck, group_norm_backward, group_norm_forward, layer_norm_forward

GRAD_TOL = 1e-6


@pytest.mark.parametrize(("shape", "groups"), [((3, 8), 2), ((2, 6, 5), 3), ((2, 4, 3, 2), 2),
                                                ((2, 4, 3, 2), 4), ((1, 3, 2, 2), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_gradcheck_full(rng, shape, groups, affine):
    c = shape[1]
    x = rng.standard_normal(shape)
    g = rng.standard_normal(c) if affine else None
    b = rng.standard_normal(c) if affine else None

    def fwd(x, g, b):
        return group_norm_forward(x, groups, g, b)

    assert gradcheck(fwd, group_norm_backward, (x, g, b), rng=rng, tol=GRAD_TOL) < GRAD_TOL


def test_one_group_is_layer_norm_over_c_and_space(rng):
    x = rng.standard_normal((3, 4, 5, 2))
    out, _ = group_norm_forward(x, 1, None, None)
    ref, _ = layer_norm_forward(x, None, None, normalized_ndim=3)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)  # same math, float64 ulps


def test_formula_with_per_channel_affine(rng):
    x = rng.standard_normal((2, 6, 4))
    g, b = rng.standard_normal(6), rng.standard_normal(6)
    out, _ = group_norm_forward(x, 3, g, b, eps=1e-3)
    xg = x.reshape(2, 3, 8)
    xhat = (xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-3)
    want = xhat.reshape(x.shape) * g[None, :, None] + b[None, :, None]
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)


def test_non_contiguous_input(rng):
    x = rng.standard_normal((4, 3, 2)).transpose(2, 1, 0)  # (2, 3, 4), strided
    out, cache = group_norm_forward(x, 3, None, None)
    ref, _ = group_norm_forward(np.ascontiguousarray(x), 3, None, None)
    np.testing.assert_array_equal(out, ref, strict=True)
    dx, _, _ = group_norm_backward(np.ones_like(x), cache)
    assert dx.shape == x.shape


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_round_trip(rng, dtype):
    x = rng.standard_normal((2, 4, 8)).astype(dtype)
    out, cache = group_norm_forward(x, 2, np.ones(4, dtype), np.zeros(4, dtype))
    ref, _ = group_norm_forward(x.astype(np.float64), 2, None, None)
    assert out.dtype == np.dtype(dtype) and cache.mean.dtype == np.float32
    # float32 compute rounded once: 4 format eps for |out| < 4
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0,
                               atol=4 * float(ml_dtypes.finfo(dtype).eps))
    dx, dg, db = group_norm_backward(np.ones(x.shape, dtype), cache)
    assert dx.dtype == dg.dtype == db.dtype == np.dtype(dtype)


def test_nan_sample_isolated_and_empty_batch(rng):
    x = rng.standard_normal((3, 4, 2))
    x[1, 0, 0] = np.nan  # poisons group 0 of sample 1 only
    x[2, 3, 1] = np.inf  # poisons group 1 of sample 2 only, without a NumPy warning
    out, cache = group_norm_forward(x, 2, None, None)
    assert np.isnan(out[1, :2]).all() and np.isfinite(out[1, 2:]).all()
    assert not np.isfinite(out[2, 2:]).any() and np.isfinite(out[2, :2]).all()
    assert np.isfinite(out[0]).all()
    dx, _, _ = group_norm_backward(np.ones_like(x), cache)
    assert np.isfinite(dx[0]).all() and np.isfinite(dx[1, 2:]).all()
    out, cache = group_norm_forward(np.zeros((0, 4, 2)), 2, np.ones(4), np.ones(4))
    dx, dg, db = group_norm_backward(np.zeros((0, 4, 2)), cache)
    assert out.shape == dx.shape == (0, 4, 2)
    np.testing.assert_array_equal(dg, np.zeros(4), strict=True)
    np.testing.assert_array_equal(db, np.zeros(4), strict=True)


def test_num_groups_must_divide_channels():
    with pytest.raises(ValueError, match=r"num_groups must divide .* C = x.shape\[1\] = 6; got 4"):
        group_norm_forward(np.zeros((2, 6)), 4, None, None)
    with pytest.raises(ValueError, match="num_groups"):
        group_norm_forward(np.zeros((2, 6)), 0, None, None)
    with pytest.raises(TypeError, match="num_groups"):
        group_norm_forward(np.zeros((2, 6)), 2.0, None, None)
