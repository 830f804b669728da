"""The NumPy reference quantize rounds in chunks: same bits as one pass, bounded memory.

Expected values: the same reference run as one chunk (REFERENCE_CHUNK raised above N), whose
agreement with ml_dtypes is tested elsewhere, and for bf16 the ml_dtypes cast itself.
"""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from normlab.precision.formats import rounding
from normlab.precision.formats.format import get_format
from normlab.precision.formats.rounding import RoundingMode, quantize_reference


def _data(n: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x[:4] = [np.nan, np.inf, -0.0, 1e30]  # specials in the first chunk
    return x.reshape(-1, 7)  # (N/7, 7): chunks cut rows in the middle


@pytest.mark.parametrize(("fmt", "mode"), [
    ("bf16", RoundingMode.NEAREST), ("e4m3", RoundingMode.NEAREST),
    ("fp4_e2m1", RoundingMode.TOWARD_ZERO), ("e5m2", RoundingMode.STOCHASTIC),
])
@pytest.mark.parametrize("seeded", [True, False])
def test_chunks_give_the_bits_of_one_pass(monkeypatch, fmt, mode, seeded):
    x = _data(7 * 1003)  # 7021 values: 7 chunks of 1000 and a partial one
    f = get_format(fmt)
    words = None
    if mode is RoundingMode.STOCHASTIC and not seeded:
        words = np.random.default_rng(5).integers(0, 2**64, x.shape, dtype=np.uint64)
    seed = 2**64 - 3000 if mode is RoundingMode.STOCHASTIC and seeded else None  # wraps
    monkeypatch.setattr(rounding, "REFERENCE_CHUNK", x.size + 1)
    whole = quantize_reference(x, f, mode, False, seed, words)
    monkeypatch.setattr(rounding, "REFERENCE_CHUNK", 1000)
    chunked = quantize_reference(x, f, mode, False, seed, words)
    assert chunked.shape == x.shape and chunked.dtype == x.dtype
    np.testing.assert_array_equal(chunked.view(np.uint32), whole.view(np.uint32))


def test_peak_memory_is_at_most_4x_the_input():
    x = np.random.default_rng(0).standard_normal((256, 4096), dtype=np.float32)  # 4 MiB
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    out = quantize_reference(x, get_format("bf16"), RoundingMode.NEAREST, False, None, None)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert peak <= 4 * x.nbytes, peak / x.nbytes  # was about 40x in one pass
    np.testing.assert_array_equal(out, x.astype(ml_dtypes.bfloat16).astype(np.float32))
