"""Edge numerics of the norms: wide rows, tiny eps, byte order, NaN rows and dgamma.

Oracles: float64 NumPy formulas written here, PyTorch float32 where it is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl
from normlab._backend import use_backend

BACKENDS = ["numba", "numpy"]


def _ln64(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """LayerNorm in float64 by the textbook formula (eps = 1e-5)."""
    x = x.astype(np.float64)
    m = x.mean(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(axis=axes, keepdims=True) + 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pytorch_layer_norm_numeric_case(backend):
    # PyTorch's test_LayerNorm_numeric: normalized_shape (256, 256, 144), U(0, 1), atol 1e-5
    x = np.random.default_rng(0).random((1, 256, 256, 144), dtype=np.float32)
    with use_backend(backend):
        out, _ = nl.layer_norm_forward(x, None, None, normalized_ndim=3)
    np.testing.assert_allclose(out, _ln64(x, (1, 2, 3)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("width", [1 << 12, 1 << 20, 1 << 24])
def test_kernel_row_error_stays_within_twice_torch_float32(width):
    # torch float32 is the yardstick; a floor of one float32 ulp at 1 keeps the bound from
    # being tighter than rounding the output itself
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).random((1, width), dtype=np.float32)
    want = _ln64(x, (1,))
    with use_backend("numba"):
        out, _ = nl.layer_norm_forward(x, None, None)
    mine = float(np.max(np.abs(out - want)))
    theirs = float(np.max(np.abs(torch.nn.functional.layer_norm(
        torch.from_numpy(x), (width,)).numpy() - want)))
    assert mine <= 2 * max(theirs, 2.0**-23), (mine, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eps_below_the_compute_dtypes_smallest_normal_is_rejected(backend):
    x32 = np.ones((2, 4), np.float32)  # constant rows: var = 0, rstd = 1/sqrt(eps)
    with use_backend(backend):
        for fn in (lambda e: nl.layer_norm_forward(x32, None, None, e),
                   lambda e: nl.rms_norm_forward(np.zeros((2, 4), np.float32), None, e),
                   lambda e: nl.group_norm_forward(x32, 1, None, None, e),
                   lambda e: nl.batch_norm_forward(x32, None, None, None, None, True, 0.9, e)):
            with pytest.raises(ValueError, match=r"eps must be >= 1.18e-38.*got 1e-300"):
                fn(1e-300)
            out, _ = fn(float(np.finfo(np.float32).tiny))  # the smallest allowed: finite
            assert np.isfinite(out).all()
        out64, _ = nl.layer_norm_forward(x32.astype(np.float64), None, None, 1e-300)
        np.testing.assert_array_equal(out64, np.zeros((2, 4)))  # float64 accepts 1e-300
        with pytest.raises(ValueError, match="float64"):
            nl.layer_norm_forward(x32.astype(np.float64), None, None, 1e-310)


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_float64_is_computed_in_float64(backend):
    x = (np.array([[0.0, 1.0, 2.0]]) + 1e8).astype(">f8")  # float32 would round to 1e8
    with use_backend(backend):
        out, _ = nl.layer_norm_forward(x, None, None)
        bn, _ = nl.batch_norm_forward(x.T.copy(), None, None, None, None, True, axis=1)
        drop, _ = nl.inverted_dropout(x, 0.0, np.random.default_rng(0))
    r = 1.0 / np.sqrt(2.0 / 3.0 + 1e-5)  # deviations -1, 0, 1; biased variance 2/3; eps
    np.testing.assert_allclose(out, [[-r, 0.0, r]], rtol=1e-9)
    np.testing.assert_allclose(bn.T, out, rtol=1e-9)
    assert out.dtype == np.float64 and drop.dtype == np.float64
    np.testing.assert_array_equal(drop, x.astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_nan_row_makes_every_dgamma_entry_nan(backend):
    # documented beside "NaN stays in its row": dgamma sums dout * x_hat over the rows
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    x[1, 2] = np.nan
    dy = rng.standard_normal((4, 6)).astype(np.float32)
    g = np.ones(6, np.float32)
    with use_backend(backend):
        out, cache = nl.layer_norm_forward(x, g, g)
        dx, dgamma, dbeta = nl.layer_norm_backward(dy, cache)
    assert np.isnan(out[1]).all() and np.isfinite(np.delete(out, 1, axis=0)).all()
    assert np.isnan(dx[1]).all() and np.isfinite(np.delete(dx, 1, axis=0)).all()
    assert np.isnan(dgamma).all()
    np.testing.assert_allclose(dbeta, dy.sum(axis=0), rtol=1e-6)
