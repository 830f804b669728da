"""Residual add fused with LayerNorm / RMSNorm: shared math, both gradients, dtypes.

Tolerances: gradient checks tol 1e-6 (float64 central differences, see test_layer_norm);
comparisons with the unfused ops are exact-math identities computed in a different order,
so 1e-12 (float64 ulps).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab import (
    add_layer_norm_backward,
    add_layer_norm_forward,
    add_rms_norm_backward,
    add_rms_norm_forward,
    gradcheck,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)

GRAD_TOL = 1e-6


def _shared(grads):
    """The sum's gradient goes to x and to residual alike: (dsum, dsum, *param grads)."""
    return (grads[0], grads[0], *grads[1:])


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5), (2, 2, 2, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_add_layer_norm_gradcheck_both_douts(rng, shape, affine):
    x, r = rng.standard_normal(shape), rng.standard_normal(shape)
    g = rng.standard_normal(shape[-1]) if affine else None
    b = rng.standard_normal(shape[-1]) if affine else None
    err = gradcheck(add_layer_norm_forward,
                    lambda do, dr, c: _shared(add_layer_norm_backward(do, dr, c)),
                    (x, r, g, b), rng=rng, tol=GRAD_TOL)
    assert err < GRAD_TOL


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5), (2, 2, 2, 3)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rms_norm_gradcheck_both_douts(rng, shape, offset):
    x, r, w = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(
        shape[-1])

    def fwd(x, r, w):
        return add_rms_norm_forward(x, r, w, offset=offset)

    err = gradcheck(fwd, lambda do, dr, c: _shared(add_rms_norm_backward(do, dr, c)),
                    (x, r, w), rng=rng, tol=GRAD_TOL)
    assert err < GRAD_TOL


def test_matches_unfused_ops(rng):
    x, r = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    out, s, cache = add_layer_norm_forward(x, r, g, b)
    ref, ref_cache = layer_norm_forward(x + r, g, b)
    np.testing.assert_array_equal(s, x + r, strict=True)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    dout, dres = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    dsum, dg, db = add_layer_norm_backward(dout, dres, cache)
    rdx, rdg, rdb = layer_norm_backward(dout, ref_cache)
    np.testing.assert_allclose(dsum, rdx + dres, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dg, rdg, rtol=0, atol=1e-12)
    np.testing.assert_allclose(db, rdb, rtol=0, atol=1e-12)
    # dresidual=None means no gradient arrives on the residual stream
    np.testing.assert_allclose(add_layer_norm_backward(dout, None, cache)[0], rdx, atol=1e-12)

    out, s, cache = add_rms_norm_forward(x, r, g, offset=1.0)
    ref, ref_cache = rms_norm_forward(x + r, g, offset=1.0)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    dsum, dw = add_rms_norm_backward(dout, dres, cache)
    rdx, rdw = rms_norm_backward(dout, ref_cache)
    np.testing.assert_allclose(dsum, rdx + dres, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dw, rdw, rtol=0, atol=1e-12)


def test_dtypes_promotion(rng):
    x = rng.standard_normal((2, 16)).astype(ml_dtypes.bfloat16)
    r = rng.standard_normal((2, 16)).astype(np.float32)
    out, s, cache = add_rms_norm_forward(x, r, np.ones(16, np.float32))
    assert out.dtype == x.dtype  # out follows x
    assert s.dtype == np.result_type(x.dtype, r.dtype)  # new residual: numpy's promotion
    dsum, dw = add_rms_norm_backward(np.ones((2, 16), x.dtype), None, cache)
    assert dsum.dtype == s.dtype and dw.dtype == np.float32
    x16 = x.astype(np.float16)
    out, s, _ = add_layer_norm_forward(x16, x16, None, None)
    assert out.dtype == s.dtype == np.float16


def test_residual_shape_mismatch_is_rejected(rng):
    with pytest.raises(ValueError, match="residual"):
        add_layer_norm_forward(np.zeros((2, 3)), np.zeros((2, 4)), None, None)
    with pytest.raises(TypeError, match="residual"):
        add_rms_norm_forward(np.zeros((2, 3)), np.zeros((2, 3), np.int64), None)
    _, _, cache = add_rms_norm_forward(np.ones((2, 3)), np.ones((2, 3)), None)
    with pytest.raises(ValueError, match="dresidual"):
        add_rms_norm_backward(np.ones((2, 3)), np.ones((3, 2)), cache)
