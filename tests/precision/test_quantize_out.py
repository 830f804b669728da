"""quantize(..., out=): same bits as without it, in place allowed, bad buffers rejected.

Expected values: the same call without ``out`` (its own correctness is tested against
ml_dtypes and hand derivations elsewhere); for bf16 also the ml_dtypes cast.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab._backend import use_backend
from normlab.precision import quantize

BACKENDS = ["numba", "numpy"]
CASES = [("bf16", "nearest"), ("e4m3", "nearest"), ("fp4_e2m1", "nearest"),
         ("e5m2", "stochastic"), ("e4m3", "toward_positive"), ("e8m0", "nearest"),
         ("e4m3fnuz", "nearest")]


def _x(dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((300, 70)) * np.exp2(rng.integers(-12, 12, (300, 70))))
    x = x.astype(dtype)
    x[0, :5] = [np.nan, np.inf, -0.0, -3.0, 1e30]
    return x  # (300, 70): 21000 values, serial and parallel thresholds aside


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("fmt", "mode"), CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_and_in_place_give_the_bits_of_a_new_array(backend, fmt, mode, dtype):
    x = _x(dtype)
    kw = {"rounding": mode, "seed": 7} if mode == "stochastic" else {"rounding": mode}
    with use_backend(backend), np.errstate(all="ignore"):
        want = quantize(x, fmt, **kw)
        buf = np.full_like(x, 123.0)
        got = quantize(x, fmt, **kw, out=buf)
        inplace = x.copy()
        same = quantize(inplace, fmt, **kw, out=inplace)
    assert got is buf and same is inplace
    u = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(got.view(u), want.view(u))
    np.testing.assert_array_equal(same.view(u), want.view(u))


def test_out_bf16_matches_ml_dtypes_and_fills_a_large_buffer():
    x = np.random.default_rng(5).standard_normal(1 << 18, dtype=np.float32)  # parallel size
    out = np.empty_like(x)
    quantize(x, "bf16", out=out)
    np.testing.assert_array_equal(out, x.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_out_buffers_are_rejected_before_anything_is_written(backend):
    x = _x()
    with use_backend(backend):
        with pytest.raises(TypeError, match=r"out must be a numpy ndarray or None; got list"):
            quantize(x, "bf16", out=[0.0])
        with pytest.raises(TypeError, match=r"out must have dtype float32 .* got dtype float64"):
            quantize(x, "bf16", out=np.empty(x.shape))
        with pytest.raises(ValueError, match=r"out must have shape \(300, 70\) .* \(70, 300\)"):
            quantize(x, "bf16", out=np.empty((70, 300), np.float32))
        strided = np.empty((300, 140), np.float32)[:, ::2]
        with pytest.raises(ValueError, match="out must be C-contiguous"):
            quantize(x, "bf16", out=strided)
        ro = np.zeros_like(x)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="out must be writeable"):
            quantize(x, "bf16", out=ro)
        big = np.zeros(x.size + 1, np.float32)
        big[:-1] = x.reshape(-1)
        before = big.copy()
        with pytest.raises(ValueError, match=r"out overlaps x; pass x itself \(in place\)"):
            quantize(big[:-1].reshape(x.shape), "bf16", out=big[1:].reshape(x.shape))
        np.testing.assert_array_equal(big, before)  # nothing written
        words = np.zeros(x.shape, np.uint64)
        with pytest.raises(ValueError, match="out overlaps random_bits"):
            quantize(x.astype(np.float64), "e4m3", rounding="stochastic", random_bits=words,
                     out=words.view(np.float64))
