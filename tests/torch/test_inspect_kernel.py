"""The inspector's statistics kernel equals its torch reference.

On the CPU the inspector reduces each operand in one pass of the numba kernel
`"operand_stats"` ([normlab.kernels.operand_stats][]); elsewhere (and with
`NORMLAB_BACKEND=numpy`, or when the kernel fails) the torch ops of
`normlab.torch.numerics._stats._reference` run. Both are compared on operands that hold
NaN, inf, zeros, tiny and huge values, for every kind of multiplier grid the recipes give:
blocks along rows (1 x 16, NVFP4's), 2-D tiles with ragged edges (16 x 16 on 37 x 70),
one per-tensor scale, no scale; float32 input laid out by rows or by columns, and bfloat16.

Tolerances: the counts, the amax, the smallest nonzero magnitude and each block's extremes
exactly (integers, and maxima and minima of the same float32 values, exact in any order);
the two float64 powers rtol 1e-12 (sums of at most 2,590 float64 terms in another order:
the relative difference is below n * 2^-53 < 3e-13). The kernel must serve every case (a
silent fallback to the reference would make the comparison vacuous), and a planted fault
in its underflow count must be caught.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

import normlab.torch as nt
from normlab import _backend
from normlab.kernels import operand_stats as kstats
from normlab.torch.numerics import _stats
from normlab.torch.numerics._quantizers import operand_quantizer

R, C = 37, 70
CASES = [(nt.NVFP4Recipe(), "dy"), (nt.NVFP4Recipe(), "w"), (nt.MXRecipe(), "x"),
         (nt.BlockwiseFp8Recipe(block_size=16), "w"), (nt.Fp8CurrentRecipe(), "x"),
         (nt.Bf16Recipe(), "x")]
LAYOUTS = ("rows", "columns", "bfloat16")


def _operand(layout: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(R, C, generator=g) * torch.logspace(-30, 5, C)  # tiny to large
    x[:, 3] *= 1e6  # a huge channel
    x[0, 0], x[1, 5], x[2, 9] = math.nan, math.inf, -math.inf
    x[3, :20] = 0.0  # zero blocks
    x[4, 16:32] = 1e-40  # float32 subnormals
    if layout == "columns":
        return x.t().contiguous().t()  # the same values, columns contiguous
    if layout == "bfloat16":
        return x.to(torch.bfloat16)
    return x


def _args(recipe, role: str, layout: str):
    q = operand_quantizer(recipe, role)
    t = _operand(layout)
    quantized = q(t)
    block = q.block_of(tuple(t.shape))
    grid, cover = _stats._grid(quantized.scales, block, t.shape)
    x = t.to(torch.float32)
    return x, quantized.values, grid, cover, _stats.clip_level(q.fmt), block is not None


def _kernel():
    """The registered kernel (loading the kernels first, so a patch is not overwritten)."""
    assert _backend.kernel("operand_stats") is not None
    return kstats.operand_stats


def _compare(got, want) -> None:
    sums, extrema, tops, lows = got
    wsums, wextrema, wtops, wlows = want
    assert torch.equal(sums[:7], wsums[:7]), (sums[:7], wsums[:7])  # numel and counts
    torch.testing.assert_close(sums[7:], wsums[7:], rtol=1e-12, atol=0.0)
    assert torch.equal(extrema, wextrema)
    assert torch.equal(tops, wtops) and torch.equal(lows, wlows)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("recipe", "role"), CASES,
                         ids=[f"{type(r).__name__}-{role}" for r, role in CASES])
def test_kernel_equals_reference(recipe, role: str, layout: str, monkeypatch) -> None:
    x, v, grid, cover, clip, ranges = _args(recipe, role, layout)
    calls = []
    kernel = _kernel()

    def counted(*args):
        out = kernel(*args)
        calls.append(out is not NotImplemented)
        return out

    monkeypatch.setitem(_backend._REGISTRY, "operand_stats", counted)
    got = _stats._element_stats(x, v, grid, cover, clip, ranges)
    assert calls == [True]  # the kernel served the case
    want = _stats._reference(x, v, grid, cover, clip, ranges)
    _compare(got, want)


def test_records_same_with_either_backend() -> None:
    """A whole inspected step: the records of the kernel path and of the torch path."""

    def run() -> list[dict]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(70, 48), torch.nn.GELU(),
                                  torch.nn.Linear(48, 16))
        with nt.inspect(net, [nt.NVFP4Recipe(), nt.Fp8CurrentRecipe()]) as log:
            net(_operand("rows")).nan_to_num().sum().backward()
            log.step()
        return log.records

    fast = run()
    with _backend.use_backend("numpy"):
        slow = run()
    assert len(fast) == len(slow) == 12
    for a, b in zip(fast, slow, strict=True):
        for key, value in a.items():
            if key == "sqnr_db" and math.isfinite(value):
                assert value == pytest.approx(b[key], rel=1e-12, abs=1e-12), key
            else:
                assert value == b[key] or (value != value and b[key] != b[key]), key


def test_planted_fault_is_caught(monkeypatch) -> None:
    """An underflow count off by one in the kernel's result fails the comparison."""
    x, v, grid, cover, clip, ranges = _args(nt.NVFP4Recipe(), "dy", "rows")
    kernel = _kernel()

    def faulty(*args):
        sums, *rest = kernel(*args)
        sums = sums.copy()
        sums[4] += 1  # underflow_n
        return (sums, *rest)

    monkeypatch.setitem(_backend._REGISTRY, "operand_stats", faulty)
    got = _stats._element_stats(x, v, grid, cover, clip, ranges)
    want = _stats._reference(x, v, grid, cover, clip, ranges)
    with pytest.raises(AssertionError):
        _compare(got, want)


def test_declines_what_it_does_not_serve() -> None:
    """float64 input, mismatched shapes and empty operands go to the reference."""
    x = np.ones((2, 3), np.float32)
    grid = np.ones((1, 1))
    assert kstats.operand_stats(x.astype(np.float64), x, grid, 2, 3, 7.0,
                                False) is NotImplemented
    assert kstats.operand_stats(x, x[:, :2], grid, 2, 3, 7.0, False) is NotImplemented
    assert kstats.operand_stats(x[:0], x[:0], grid, 1, 3, 7.0, False) is NotImplemented


@pytest.mark.parametrize(("recipe", "role"), CASES,
                         ids=[f"{type(r).__name__}-{role}" for r, role in CASES])
def test_small_array_steps_same_in_torch_and_numpy(recipe, role: str) -> None:
    """The scale extremes and the worst block's range: NumPy on the CPU, torch ops on
    other devices (run here on CPU tensors), exactly equal (maxima, minima and float64
    log2, which the two libraries compute alike)."""
    x, v, grid, cover, clip, ranges = _args(recipe, role, "rows")
    scales = operand_quantizer(recipe, role)(_operand("rows")).scales
    if scales is not None:
        scales = scales.clone()
        scales.view(-1)[0] = math.nan  # a NaN block's scale is left out
    got = _stats._scale_extremes(None if scales is None else scales.numpy(), np)
    want = _stats._scale_extremes(scales, torch)
    assert [float(g) for g in got] == [float(w) for w in want]
    if ranges:
        _, _, tops, lows = _stats._reference(x, v, grid, cover, clip, ranges)
        tops, lows = tops.to(torch.float64), lows.to(torch.float64)
        got = _stats._worst_range(tops.numpy(), lows.numpy(), np)
        assert float(got) == float(_stats._worst_range(tops, lows, torch))
