"""NVFP4 and blockwise FP8 on tensors equal their NumPy twins bit for bit (1-D and 2-D
blocks, padding, zero/NaN/inf blocks, stochastic elements from a seed, tensor_amax)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab import precision


def _same(t: torch.Tensor, a: np.ndarray) -> bool:
    got = t.cpu().numpy()
    ut = {4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    return got.shape == a.shape and np.array_equal(got.view(ut), np.asarray(a, got.dtype).view(ut))


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))
    x = x.astype(dtype)
    x[0, :16] = 0.0  # a zero block
    x[1, 3] = np.nan  # a NaN block
    x[2, 40] = np.inf  # an infinite block
    x[3, :] *= dtype(1e-30)  # tiny blocks: large scales
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "kw",
    [{}, {"axis": 0}, {"block_shape": (16, 16)}, {"tensor_amax": 1e3},
     {"rounding": "stochastic", "seed": 2**64 - 9}],
)
def test_nvfp4_matches_numpy(rng, dtype, kw):
    x = _data(rng, (37, 70), dtype)
    for arr in (x, np.where(np.isfinite(x), x, 0.5).astype(dtype)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = precision.nvfp4_quantize(arr, **kw)
            got = nt.nvfp4_quantize(torch.from_numpy(arr), **kw)
            assert _same(got.elements, want.elements)
            assert _same(got.block_scales, want.block_scales)
            assert got.tensor_scale.item() == want.tensor_scale
            assert _same(got.dequantize(), want.dequantize())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "kw",
    [{}, {"block_shape": (16, 16), "fmt": "e5m2"}, {"block_shape": (32,)},
     {"power_of_2_scales": True, "amax_epsilon": 1e-3}],
)
def test_blockwise_matches_numpy(rng, dtype, kw):
    x = _data(rng, (37, 300), dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        want = precision.blockwise_quantize(x, **kw)
        got = nt.blockwise_quantize(torch.from_numpy(x), **kw)
        for name in ("data", "scales", "scale_inv"):
            assert _same(getattr(got, name), getattr(want, name)), name
        assert _same(got.dequantize(), want.dequantize())


def test_block_errors():
    with pytest.raises(ValueError, match="rounding"):
        nt.nvfp4_quantize(torch.ones(16), rounding="toward_zero")
    with pytest.raises(ValueError, match="exactly one source"):
        nt.nvfp4_quantize(torch.ones(16), rounding="stochastic")
    with pytest.raises(ValueError, match="block_shape"):
        nt.blockwise_quantize(torch.ones(4, 4), block_shape=(1, 2, 3))
    with pytest.raises(ValueError, match="amax_epsilon"):
        nt.blockwise_quantize(torch.ones(4, 4), amax_epsilon=-1.0)


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_hadamard_signs_and_values_match_numpy(rng, seed):
    # small integers: every partial sum is exact, so any summation order gives the same
    # bits and the transform must match NumPy's exactly
    x = rng.integers(-8, 8, size=(5, 64)).astype(np.float32)
    want = precision.random_hadamard_transform(x, 16, seed=seed)
    got = nt.random_hadamard_transform(torch.from_numpy(x), 16, seed=seed)
    assert _same(got, want)
    back = nt.inverse_random_hadamard_transform(got, 16, seed=seed)
    assert torch.equal(back, torch.from_numpy(x))


def test_hadamard_random_data_within_sum_rounding(rng):
    x = rng.standard_normal((3, 32, 8))
    want = precision.random_hadamard_transform(x, 8, seed=3, axis=1)
    got = nt.random_hadamard_transform(torch.from_numpy(x), 8, seed=3, axis=1).numpy()
    # an 8-term dot product in float64 in another order: |diff| <= 8 eps64 sum|terms|
    bound = 8 * np.finfo(np.float64).eps * np.sqrt(8) * np.abs(x).max()
    assert np.abs(got - want).max() <= bound
    with pytest.raises(ValueError, match="multiple of block"):
        nt.random_hadamard_transform(torch.ones(10), 4, seed=0)


def test_nvfp4_block_scale_in_te_operation_order():
    # amax_b * float32(S_enc / 6) is exactly 1.0625 here, the E4M3 tie between 1.0 and
    # 1.125 (ties to even: 1.0); the other association lands above the tie (1.125)
    amax_t, amax_b = 18.38990592956543, 0.043614454567432404
    x = torch.zeros(16)
    x[3] = amax_b
    got = nt.nvfp4_quantize(x, tensor_amax=amax_t)
    assert got.block_scales.tolist() == [1.0]
    want = precision.nvfp4_quantize(x.numpy(), tensor_amax=amax_t)
    assert _same(got.block_scales, want.block_scales) and _same(got.elements, want.elements)
