r"""The inspector's statistics of one quantised operand, in two steps that a reduction can join.

Dimension letters: R, C the operand's rows and columns; br x bc one block.

[raw_stats][normlab.torch.numerics._stats.raw_stats] reduces an operand `x` (R, C) and its
quantisation to a few numbers that combine across ranks or micro-batches by a sum
(`SUM_KEYS`: counts and powers) or a maximum (`MAX_KEYS`; minima enter negated), kept as two
float64 tensors on the operand's device (no host sync).
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

import torch

from normlab.precision.formats.format import Format
from normlab.precision.scaled import tiling as blocks
from normlab.torch.namespace import TORCH
from normlab.torch.numerics._quantizers import Quantized

__all__ = ["MAX_KEYS", "SUM_KEYS", "clip_level", "finish", "raw_stats"]

SUM_KEYS = ("numel", "nonfinite_n", "finite_n", "nonzero_n", "underflow_n", "overflow_n",
            "compared_n", "signal", "noise")
"""The statistics that combine by a sum."""
MAX_KEYS = ("amax", "neg_min_nonzero", "worst_block_range", "scale_max", "neg_scale_min")
"""The statistics that combine by a maximum (minima negated)."""

_NONE = -math.inf  # a maximum over nothing


def _block_ranges(a: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """log2(block amax / block min nonzero) of |x| `a` (R, C; non-finite set to 0), per
    block with a nonzero value; -inf for the others."""
    tiles = blocks.tile(a, block, xp=TORCH)  # 1,nR,r,nC,c (zero-padded)
    top = tiles.amax(dim=(2, 4))  # 1,nR,nC
    low = torch.where(tiles > 0, tiles, torch.inf).amin(dim=(2, 4))
    ranges = torch.log2(top.to(torch.float64)) - torch.log2(low.to(torch.float64))
    return torch.where(top > 0, ranges, _NONE)


def clip_level(fmt: Format) -> float:
    """The smallest scaled magnitude that rounds beyond `fmt`'s largest value: max plus half
    the spacing of the top binade."""
    return float(fmt.max + 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits - 1))


def _per_element(scales: torch.Tensor | None, block: tuple[int, int] | None,
                 shape: torch.Size) -> torch.Tensor:
    """Each element's dequantisation multiplier (float64): its block's, broadcast."""
    if scales is None:
        return torch.ones((), dtype=torch.float64)
    s = scales.to(torch.float64)
    if block is None:  # one per-tensor scale
        return s.reshape(())
    grid = s.reshape(blocks.grid_shape(tuple(shape), block))  # nR,nC
    return blocks.spread(grid, block, tuple(shape), xp=TORCH)  # R,C


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
    """
    x = x.detach().to(torch.float32)  # R,C  (16-bit values widen exactly)
    v = q.values.to(torch.float32)
    a = x.abs()
    finite = torch.isfinite(x)
    nonzero = finite & (x != 0)
    scale = _per_element(q.scales, block, x.shape)  # R,C or a scalar
    clipped = (scale > 0) & (a.to(torch.float64) >= scale * clip_level(fmt))
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
    lowest = torch.where(nonzero, a, torch.inf).amin() if x.numel() else torch.tensor(
        torch.inf, device=x.device)
    none = torch.tensor(_NONE, dtype=torch.float64, device=x.device)
    worst = (_block_ranges(a, block).amax().to(torch.float64)
             if block is not None and x.numel() else none)
    if q.scales is not None and q.scales.numel():
        s = q.scales.to(torch.float64).reshape(-1)  # blocks (NaN-block scales left out)
        ok = torch.isfinite(s)
        smax, nsmin = torch.where(ok, s, _NONE).amax(), -torch.where(ok, s, math.inf).amin()
    else:
        smax, nsmin = none, none
    amax = a.amax().to(torch.float64) if x.numel() else none.new_zeros(())
    maxima = torch.stack([amax, -lowest.to(torch.float64), worst, smax, nsmin])
    return sums, maxima


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
