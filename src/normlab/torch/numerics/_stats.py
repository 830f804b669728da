r"""The inspector's statistics of one quantised operand, in two steps that a reduction can join.

Dimension letters: R, C the operand's rows and columns; br x bc one block.

[raw_stats][normlab.torch.numerics._stats.raw_stats] reduces an operand `x` (R, C) and its
quantisation to a few numbers that combine across ranks or micro-batches by a sum
(`SUM_KEYS`: counts and powers) or a maximum (`MAX_KEYS`; minima enter negated), kept as two
float64 tensors on the operand's device (no host sync off the CPU). On the CPU the element
statistics come from one pass of the numba kernel `"operand_stats"`
([normlab.kernels.operand_stats][]) and the small per-block arrays are finished in NumPy;
elsewhere (and without the kernel) torch ops on the whole operand (`_reference`, the
kernel's specification) compute the same numbers, the float64 powers summed in another
order.
[finish][normlab.torch.numerics._stats.finish] turns them into the record's fields:

* `underflow`: of the nonzero finite values of `x`, the fraction whose quantised value is 0
  (0 when `x` has none);
* `overflow`: of the finite values of `x`, the fraction that saturate or become non-finite:
  the quantised value is not finite (non-saturating rounding beyond the format's range, or
  a block made NaN by a NaN in it), or the scaled magnitude $|x| / s$ ($s$ the block's
  dequantisation multiplier, 1 for unscaled rounding) is at least the format's largest
  value plus half its spacing there, so that rounding to nearest without a largest value
  would have gone beyond it: the value was clipped (0 when `x` has no finite value). The
  block's largest value itself, which rounds to the format's max, does not count, nor does
  a block whose scale is 0 (NVFP4 block scales that underflow E4M3: its values underflow);
* `sqnr_db`: $10 \log_{10}(\sum x^2 / \sum (x - q)^2)$ over the elements where both `x` and `q`
  are finite, in float64; inf when the quantisation is exact there, -inf when the signal is
  0 and the error is not, NaN when there is no such element;
* `nonfinite`: the fraction of the elements of `x` that are NaN or infinite (counted, never
  raised);
* `amax`: $\max |x|$ over the finite values (0 when there are none);
* `dynamic_range`: $\log_2(\mathrm{amax} / \min_{x \ne 0} |x|)$ over the finite values, in
  binades (None when no value is nonzero);
* `worst_block_range`: the largest such range within one block (block recipes; None
  otherwise);
* `scale_min`, `scale_max`: the smallest and largest dequantisation multiplier over the
  blocks (the per-tensor recipes' one `scale_inv`; None for unscaled rounding).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from normlab import _backend
from normlab.precision.formats.format import Format
from normlab.precision.scaled import tiling as blocks
from normlab.torch.namespace import TORCH
from normlab.torch.numerics._quantizers import Quantized
from normlab.torch.training import _operand_ops as ops

__all__ = ["MAX_KEYS", "SUM_KEYS", "clip_level", "finish", "raw_stats"]

SUM_KEYS = ("numel", "nonfinite_n", "finite_n", "nonzero_n", "underflow_n", "overflow_n",
            "compared_n", "signal", "noise")
"""The statistics that combine by a sum."""
MAX_KEYS = ("amax", "neg_min_nonzero", "worst_block_range", "scale_max", "neg_scale_min")
"""The statistics that combine by a maximum (minima negated)."""

_NONE = -math.inf  # a maximum over nothing


def clip_level(fmt: Format) -> float:
    """The smallest scaled magnitude that rounds beyond `fmt`'s largest value: max plus half
    the spacing of the top binade."""
    return float(fmt.max + 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits - 1))


def _grid(scales: torch.Tensor | None, block: tuple[int, int] | None,
          shape: torch.Size) -> tuple[torch.Tensor, tuple[int, int]]:
    """The dequantisation multipliers as a float64 grid (nR, nC) and its block: the
    quantizer's blocks, or one block covering the operand (a per-tensor scale; 1 for
    unscaled rounding)."""
    whole = (max(int(shape[0]), 1), max(int(shape[1]), 1))
    cover = whole if block is None else block
    if scales is None:
        return torch.ones(blocks.grid_shape(tuple(shape), cover), dtype=torch.float64), cover
    s = scales.to(torch.float64)
    if block is None:  # one per-tensor scale
        return s.reshape(1, 1), cover
    return s.reshape(blocks.grid_shape(tuple(shape), block)), cover  # nR,nC


def _reference(x: torch.Tensor, v: torch.Tensor, grid: torch.Tensor, block: tuple[int, int],
               clip: float, ranges: bool) -> tuple[torch.Tensor, ...]:
    """The element statistics of operand `x` (R, C, float32, non-empty) quantised as `v`,
    in torch ops on any device: the specification of the kernel `"operand_stats"`
    ([normlab.kernels.operand_stats][], which lists what it returns)."""
    a = x.abs()
    finite = torch.isfinite(x)
    nonzero = finite & (x != 0)
    scale = (grid.reshape(()) if grid.numel() == 1  # one multiplier, broadcast
             else blocks.spread(grid, block, tuple(x.shape), xp=TORCH))  # R,C
    clipped = (scale > 0) & (a.to(torch.float64) >= scale * clip)
    overflow = finite & (~torch.isfinite(v) | clipped)
    both = finite & torch.isfinite(v)
    x64 = torch.where(both, x, 0.0).to(torch.float64)
    err = x64 - torch.where(both, v, 0.0).to(torch.float64)
    sums = torch.stack([
        torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
        (~finite).sum().to(torch.float64), finite.sum().to(torch.float64),
        nonzero.sum().to(torch.float64), (nonzero & (v == 0)).sum().to(torch.float64),
        overflow.sum().to(torch.float64), both.sum().to(torch.float64), (x64 * x64).sum(),
        (err * err).sum()])
    a = torch.where(finite, a, 0.0)  # R,C
    extrema = torch.stack([a.amax(), torch.where(nonzero, a, torch.inf).amin()])
    if not ranges:
        empty = a.new_empty((0, 0))
        return sums, extrema, empty, empty
    tiles = blocks.tile(a, block, xp=TORCH)  # 1,nR,r,nC,c (zero-padded)
    tops = tiles.amax(dim=(2, 4))[0]  # nR,nC
    lows = torch.where(tiles > 0, tiles, torch.inf).amin(dim=(2, 4))[0]  # nR,nC
    return sums, extrema, tops, lows


def _reference_numpy(x: np.ndarray, v: np.ndarray, grid: np.ndarray, br: int, bc: int,
                     clip: float, ranges: bool) -> tuple[np.ndarray, ...]:
    """`_reference` with the kernel's NumPy arguments (what runs if the kernel fails)."""
    out = _reference(torch.from_numpy(np.array(x)), torch.from_numpy(np.array(v)),
                     torch.from_numpy(np.array(grid)), (br, bc), clip, ranges)
    return tuple(t.numpy() for t in out)


def _element_stats(x: torch.Tensor, v: torch.Tensor, grid: torch.Tensor,
                   block: tuple[int, int], clip: float, ranges: bool
                   ) -> tuple[torch.Tensor, ...]:
    """`_reference`'s results; CPU operands go to the kernel `"operand_stats"` (one pass,
    no temporaries) through zero-copy views."""
    if x.device.type == "cpu" and _backend.kernel("operand_stats") is not None:
        xs, vs = ops.numpy_view(x), ops.numpy_view(v)
        if xs is not None and vs is not None and xs.dtype == vs.dtype == np.float32:
            with ops.kernel_threads():  # the operand kernels' thread policy
                out = _backend.dispatch("operand_stats", _reference_numpy, xs, vs,
                                        grid.numpy(), block[0], block[1], clip, ranges)
            return tuple(torch.from_numpy(a) for a in out)
    return _reference(x, v, grid, block, clip, ranges)


def raw_stats(x: torch.Tensor, q: Quantized, fmt: Format,
              block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums (`SUM_KEYS`) and maxima (`MAX_KEYS`) of operand `x` (R, C) quantised as `q`.

    Parameters
    ----------
    x : torch.Tensor
        The operand as it entered the GEMM, 2-D, any float dtype.
    q : Quantized
        Its quantisation.
    fmt : Format
        The element format (its `max` and spacing mark saturated elements).
    block : tuple of int or None
        One block's (rows, columns) for the worst block's range; None: not a block recipe.

    Returns
    -------
    sums, maxima : torch.Tensor
        float64, shapes (len(SUM_KEYS),) and (len(MAX_KEYS),), on `x`'s device.

    Notes
    -----
    One pass over the operand on the CPU (the numba kernel `"operand_stats"`), torch ops
    on the whole operand elsewhere; the same counts and extremes either way, the float64
    powers summed in another order.
    """
    x = x.detach().to(torch.float32)  # R,C  (16-bit values widen exactly)
    v = q.values.to(torch.float32)
    if not x.numel():
        none = torch.tensor(_NONE, dtype=torch.float64, device=x.device)
        smax, nsmin = _scale_extremes(q.scales, torch, x.device)
        sums = torch.zeros(len(SUM_KEYS), dtype=torch.float64, device=x.device)
        return sums, torch.stack([none.new_zeros(()), none, none, smax, nsmin])
    grid, cover = _grid(q.scales, block, x.shape)
    sums, extrema, tops, lows = _element_stats(x, v, grid.to(x.device), cover,
                                               clip_level(fmt), block is not None)
    if x.device.type != "cpu":  # torch ops, no host sync
        smax, nsmin = _scale_extremes(q.scales, torch, x.device)
        worst = (_worst_range(tops.to(torch.float64), lows.to(torch.float64), torch)
                 if block is not None else smax.new_full((), _NONE))
        extrema = extrema.to(torch.float64)
        return sums, torch.stack([extrema[0], -extrema[1], worst, smax, nsmin])
    # CPU: the small arrays in NumPy, single-threaded (no parallel region of torch's per op)
    smax, nsmin = _scale_extremes(None if q.scales is None else q.scales.numpy(), np)
    worst = (_worst_range(tops.numpy().astype(np.float64), lows.numpy().astype(np.float64),
                          np) if block is not None else _NONE)
    amax, low = extrema.tolist()
    return sums, torch.tensor([amax, -low, float(worst), float(smax), float(nsmin)],
                              dtype=torch.float64)


def _scale_extremes(scales: Any, lib: Any, device: Any = None) -> tuple[Any, Any]:
    """(max, -min) of the finite multipliers (NaN-block scales left out), `_NONE` for none,
    in `lib` (torch or numpy: the same float64 values, a max and a min being exact)."""
    if scales is None or not math.prod(scales.shape):
        none = _NONE if lib is np else torch.tensor(_NONE, dtype=torch.float64, device=device)
        return none, none
    s = scales.reshape(-1)
    s = s.astype(np.float64) if lib is np else s.to(torch.float64)  # blocks
    ok = lib.isfinite(s)
    return lib.where(ok, s, _NONE).max(), -lib.where(ok, s, math.inf).min()


def _worst_range(tops: Any, lows: Any, lib: Any) -> Any:
    """max over blocks with a nonzero value of log2(top) - log2(low) (float64 `tops`,
    `lows`; `_NONE` when no block has one), in `lib` (torch or numpy, whose float64 log2
    agree)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # log2(0) of empty blocks
        ranges = lib.log2(tops) - lib.log2(lows)
    return lib.where(tops > 0, ranges, _NONE).max()


def _ratio(n: float, d: float) -> float:
    return n / d if d > 0 else 0.0


def finish(sums: list[float], maxima: list[float]) -> dict[str, Any]:
    """The record fields (module header) from `raw_stats`' numbers (as Python floats)."""
    s = dict(zip(SUM_KEYS, sums, strict=True))
    m = dict(zip(MAX_KEYS, maxima, strict=True))
    signal, noise = s["signal"], s["noise"]
    if s["compared_n"] == 0:
        sqnr = math.nan
    elif noise == 0:
        sqnr = math.inf
    elif signal == 0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
    amax = max(m["amax"], 0.0)
    low = -m["neg_min_nonzero"]
    return {
        "amax": amax,
        "underflow": _ratio(s["underflow_n"], s["nonzero_n"]),
        "overflow": _ratio(s["overflow_n"], s["finite_n"]),
        "sqnr_db": sqnr,
        "nonfinite": _ratio(s["nonfinite_n"], s["numel"]),
        "numel": int(s["numel"]),
        "dynamic_range": (math.log2(amax) - math.log2(low)
                          if s["nonzero_n"] > 0 and math.isfinite(low) else None),
        "worst_block_range": m["worst_block_range"] if m["worst_block_range"] > _NONE else None,
        "scale_min": -m["neg_scale_min"] if m["scale_max"] > _NONE else None,
        "scale_max": m["scale_max"] if m["scale_max"] > _NONE else None,
    }
