"""NVFP4 on tensors whose blocks tile them (read in place) and the fused fake-quantise path:
both equal the NumPy twin bit for bit (tolerance 0), for every blocked axis and layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab import precision
from normlab.torch.nvfp4 import nvfp4_fake_quantize


def _bits_equal(t: torch.Tensor, a: np.ndarray) -> bool:
    got = t.numpy()
    ut = {4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    return got.shape == a.shape and np.array_equal(got.view(ut), np.asarray(a, got.dtype).view(ut))


def _data(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))).astype(dtype)
    flat = x.reshape(-1)
    flat[:16] = 0.0  # a zero block (along the last axis)
    flat[40] = np.nan
    flat[77] = -np.inf
    return x


CASES = [((32, 48), {}), ((32, 48), {"axis": 0}), ((4, 32, 16), {"axis": 1}),
         ((32, 48), {"block_shape": (16, 16)}), ((2, 32, 64), {"block_shape": (16, 16)}),
         ((48, 32), {"axis": 0, "rounding": "stochastic", "seed": 2**64 - 100}),
         ((33, 40), {"axis": 0})]  # not tiled: the padded path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "kw"), CASES)
def test_tiled_layouts_match_numpy(shape, kw, dtype):
    x = _data(shape, dtype)
    for arr in (x, np.where(np.isfinite(x), x, 0.5).astype(dtype)):
        with np.errstate(over="ignore", invalid="ignore"):
            want = precision.nvfp4_quantize(arr, **kw)
        got = nt.nvfp4_quantize(torch.from_numpy(arr), **kw)
        assert _bits_equal(got.elements, want.elements)
        assert _bits_equal(got.block_scales, want.block_scales)
        deq = want.dequantize()
        assert _bits_equal(got.dequantize(), deq)
        assert _bits_equal(nvfp4_fake_quantize(torch.from_numpy(arr), **kw), deq)


def test_fake_quantize_keeps_bf16_input_exact():
    x = torch.from_numpy(_data((32, 32), np.float32)).to(torch.bfloat16)
    want = nt.nvfp4_quantize(x, axis=0).dequantize()
    assert torch.equal(nvfp4_fake_quantize(x, axis=0).view(torch.int32), want.view(torch.int32))
