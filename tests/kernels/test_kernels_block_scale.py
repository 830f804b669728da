"""The block-amax kernel equals the NumPy reference; the recipes agree across backends.

Exact comparisons (a max is one of its inputs): float32 and float64, 1-D and 2-D blocks,
lengths that are not multiples of the block, NaN (which must win), inf, -0, 1 and 2
threads; then NVFP4, blockwise FP8 and MX through both backends, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from normlab import _backend  # noqa: E402
from normlab.precision import (  # noqa: E402
    blockwise_quantize,
    mx_quantize,
    nvfp4_quantize,
)
from normlab.precision.scaled import tiling as blocks  # noqa: E402


@pytest.fixture(autouse=True)
def _parallel_even_when_small(monkeypatch):
    """Small test arrays still take the parallel version (normally serial below 2^17)."""
    from normlab.kernels import _adapt

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 0)


def _x(rng, shape, dtype):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))).astype(dtype)
    flat = x.reshape(-1)
    flat[::97] = np.nan
    flat[5::101] = -np.inf
    flat[7::89] = -0.0
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "block"), [
    ((7, 100), (16,)), ((3, 40, 50), (16, 16)), ((300,), (128,)), ((130, 129), (128, 128)),
    ((5, 64), (1, 16)),
])
def test_block_amax_kernel_matches_reference(dtype, shape, block, rng):
    x = _x(rng, shape, dtype)
    with _backend.use_backend("numpy"), np.errstate(invalid="ignore"):
        ref = blocks.block_amax(x, block)
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            got = blocks.block_amax(x, block)
            assert got.shape == ref.shape
            same = (got == ref) | (np.isnan(got) & np.isnan(ref))
            assert same.all(), threads
    finally:
        numba.set_num_threads(old)
    assert np.isnan(ref).any()  # the NaN case is exercised


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_recipes_agree_across_backends(dtype, rng):
    x = rng.standard_normal((64, 96)).astype(dtype)
    x[3, 5] = np.nan
    calls = [
        lambda: nvfp4_quantize(x).elements,
        lambda: nvfp4_quantize(x, block_shape=(16, 16)).block_scales,
        lambda: nvfp4_quantize(x, axis=0, rounding="stochastic", seed=4).elements,
        lambda: blockwise_quantize(x, block_shape=(1, 32)).data,
        lambda: mx_quantize(x, "e4m3").elements,
        lambda: mx_quantize(x, "int8", axis=0).elements,
    ]
    for call in calls:
        with np.errstate(invalid="ignore"):
            with _backend.use_backend("numba"):
                a = call()
            with _backend.use_backend("numpy"):
                b = call()
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
