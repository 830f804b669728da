"""The inspector's operand statistics kernel: the numba side of
`normlab.torch.numerics._stats` (the adapter).

Dimension letters: R, C the operand's rows and columns; br x bc one block; nR x nC the
block grid.

Contract: `operand_stats(x, v, grid, br, bc, clip, ranges)` receives the reference's
arguments (`normlab._backend.KERNELS` names it): the operand `x` and its quantised values
`v`, float32 arrays (R, C); the float64 multiplier grid (nR, nC) of blocks br x bc (one
block covering the operand for a per-tensor scale or none); the clip level of the element
format; whether the per-block extremes are wanted. It returns what the reference returns:

* `sums`, float64 (9,): numel and the counts, then sum x^2 and sum (x - v)^2 over the
  elements where both are finite (the reference's `SUM_KEYS`);
* `extrema`, float32 (2,): max |x| over finite x (0 when none) and min nonzero |x|
  (inf when none);
* `tops`, `lows`, float32 (nR, nC) (or (0, 0) without `ranges`): each block's largest and
  smallest nonzero finite |x| (0 and inf when the block has none).

Counts and extremes are exact, so they equal the reference's; the two powers are float64
sums in another order (relative difference of the order of 1e-16 per term). Anything that
is not two non-empty 2-D float32 arrays of one shape: `NotImplemented`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels._adapt import launch
from normlab.kernels.operand_stats_jit import COUNTS, row_stats

__all__: list[str] = []

_F32 = np.dtype(np.float32)


def _c_order(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def operand_stats(x: np.ndarray, v: np.ndarray, grid: np.ndarray, br: int, bc: int,
                  clip: float, ranges: bool) -> Any:
    """The kernel of `"operand_stats"` (module header)."""
    if (x.ndim != 2 or x.shape != v.shape or x.size == 0 or x.dtype != _F32
            or v.dtype != _F32 or grid.ndim != 2):
        return NotImplemented
    R, C = x.shape
    x, v = _c_order(x), _c_order(v)
    grid = _c_order(grid.astype(np.float64, copy=False))
    nC = -(-C // bc) if ranges else 0
    counts = np.empty((R, len(COUNTS)), np.int64)  # R,6
    powers = np.empty((R, 2), np.float64)  # R,2
    extrema = np.empty((R, 2), np.float32)  # R,2
    tops = np.empty((R if ranges else 0, nC), np.float32)  # R,nC
    lows = np.empty((R if ranges else 0, nC), np.float32)  # R,nC
    launch(row_stats, x.size, x, v, grid, int(br), int(bc), float(clip), bool(ranges),
           counts, powers, extrema, tops, lows)
    sums = np.concatenate([[float(x.size)], counts.sum(axis=0).astype(np.float64),
                           powers.sum(axis=0)])
    ext = np.array([extrema[:, 0].max(), extrema[:, 1].min()], np.float32)
    if ranges:
        starts = np.arange(0, R, br)  # the first row of each block row
        tops = np.maximum.reduceat(tops, starts, axis=0)  # nR,nC
        lows = np.minimum.reduceat(lows, starts, axis=0)  # nR,nC
    return sums, ext, tops, lows
