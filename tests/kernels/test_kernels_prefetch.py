"""Software prefetch in the row-norm kernels and the benchmark's copy changes no value.

Oracle: the same kernel with prefetching off (`MIN_BYTES` raised above every test array),
whose results the other kernel tests hold to the float64 references. The prefetching
kernels must agree bit for bit (a prefetch only requests cache lines; the blocks of the
output sweep compute each element by the same expression), including rows whose width
is not a multiple of a block or a cache line and prefetch targets past the array's end.
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import normlab as nl  # noqa: E402
from normlab._backend import use_backend  # noqa: E402
from normlab.kernels import prefetch_jit  # noqa: E402
from normlab.kernels.copy import parallel_copy  # noqa: E402

# widths: below one 1 KiB block, not a multiple of a line, several blocks with a tail
SHAPES = [(1, 1), (3, 33), (17, 1000), (5, 4099), (257, 64), (40, 300)]


def _all_results(x, dy, res, g, b):
    """Every row-norm kernel's outputs (forward, cache statistics, backward) on one input."""
    with use_backend("numba"):
        out, c = nl.layer_norm_forward(x, g, b)
        ln = (out, c.mean, c.rstd, *nl.layer_norm_backward(dy, c))
        out, c = nl.rms_norm_forward(x, g)
        rms = (out, c.rstd, *nl.rms_norm_backward(dy, c))
        out, s, c = nl.add_layer_norm_forward(x, res, g, b)
        aln = (out, s, *nl.add_layer_norm_backward(dy, res, c))
        out, s, c = nl.add_rms_norm_forward(x, res, g)
        arms = (out, s, *nl.add_rms_norm_backward(dy, res, c))
    return (*ln, *rms, *aln, *arms)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefetching_kernels_are_bit_identical(shape, dtype, monkeypatch):
    rng = np.random.default_rng(11)
    x, dy, res = ((rng.standard_normal(shape) * 3 + 2).astype(dtype) for _ in range(3))
    g, b = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(2))
    monkeypatch.setattr(prefetch_jit, "MIN_BYTES", 1 << 62)  # off
    plain = _all_results(x, dy, res, g, b)
    monkeypatch.setattr(prefetch_jit, "MIN_BYTES", 0)  # on, whatever the size
    assert prefetch_jit.ahead_of(x) > 0
    fetched = _all_results(x, dy, res, g, b)
    for a, p in zip(fetched, plain, strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), p.view(np.uint8))


def test_large_arrays_prefetch_by_default():
    big = np.empty(prefetch_jit.MIN_BYTES // 4, np.float32)
    assert prefetch_jit.ahead_of(big) == prefetch_jit.AHEAD_BYTES // 4
    assert prefetch_jit.ahead_of(big[: big.size // 2]) == 0  # fits a core's cache


@pytest.mark.parametrize("n", [1, 15, 16, 257, 100_003])
@pytest.mark.parametrize("on", [False, True])
def test_parallel_copy_copies_every_element(n, on, monkeypatch):
    monkeypatch.setattr(prefetch_jit, "MIN_BYTES", 0 if on else 1 << 62)
    src = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    dst = np.full_like(src, np.nan)
    parallel_copy(src, dst)
    np.testing.assert_array_equal(dst, src)
