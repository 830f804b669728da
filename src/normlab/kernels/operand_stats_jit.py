"""The compiled loop of the inspector's operand statistics (numba): one pass per operand.

Dimension letters: R, C the operand's rows and columns; br x bc one block; nR x nC the
block grid.

`row_stats` reads an operand `x` (R, C) and its quantised values `v` (R, C), both float32,
once, and writes per row what `normlab.torch.numerics._stats` reduces over the whole
operand: six counts, two float64 powers, the amax and the smallest nonzero magnitude, and
(when blocks are asked for) each block's largest and smallest nonzero magnitude within the
row. Every row is one parallel task writing its own output rows, so the result does not
depend on the thread count; the adapter (`normlab.kernels.operand_stats`) sums the rows in
order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from normlab.kernels._adapt import jit

__all__ = ["COUNTS", "row_stats"]

COUNTS = ("nonfinite_n", "finite_n", "nonzero_n", "underflow_n", "overflow_n", "compared_n")
"""The columns of `row_stats`' `counts`, in order."""


@jit()
def row_stats(x, v, grid, br, bc, clip, ranges, counts, powers, extrema, tops, lows):
    """Per row `i` of `x`/`v` (R, C): counts[i] (R, 6; `COUNTS`), powers[i] = (sum x^2,
    sum (x - v)^2) over elements where both are finite (float64), extrema[i] = (max |x|,
    min nonzero |x|) over finite x (float32; inf when none), and with `ranges` set
    tops[i, j] / lows[i, j] = the largest / smallest nonzero |x| of column block j in row i
    (0 / inf when none).

    An element is clipped when its block's multiplier `s = grid[i // br, j // bc]`
    (float64) is positive and `|x| >= s * clip` (the threshold in float64, as the
    reference computes it). The row runs block by block (`bc` columns, the last one
    ragged), so each block's multiplier and threshold are read once.
    """
    R, C = x.shape
    nC = -(-C // bc)
    for i in prange(R):
        bi = i // br
        n_nonfinite = 0
        n_finite = 0
        n_nonzero = 0
        n_under = 0
        n_over = 0
        n_both = 0
        signal = 0.0
        noise = 0.0
        top = np.float32(0.0)
        low = np.float32(np.inf)
        for jb in range(nC):  # one block of the row at a time: one multiplier, one threshold
            s = grid[bi, jb]
            clips = s > 0.0
            threshold = s * clip
            btop = np.float32(0.0)
            blow = np.float32(np.inf)
            for j in range(jb * bc, min(C, (jb + 1) * bc)):
                xv = x[i, j]
                if not math.isfinite(xv):
                    n_nonfinite += 1
                    continue
                n_finite += 1
                vv = v[i, j]
                a = abs(xv)
                v_finite = math.isfinite(vv)
                btop = max(btop, a)
                if xv != 0:
                    n_nonzero += 1
                    if vv == 0:
                        n_under += 1
                    blow = min(blow, a)
                if not v_finite or (clips and np.float64(a) >= threshold):
                    n_over += 1
                if v_finite:
                    n_both += 1
                    xd = np.float64(xv)
                    e = xd - np.float64(vv)
                    signal += xd * xd
                    noise += e * e
            top = max(top, btop)
            low = min(low, blow)
            if ranges:
                tops[i, jb] = btop
                lows[i, jb] = blow
        counts[i, 0] = n_nonfinite
        counts[i, 1] = n_finite
        counts[i, 2] = n_nonzero
        counts[i, 3] = n_under
        counts[i, 4] = n_over
        counts[i, 5] = n_both
        powers[i, 0] = signal
        powers[i, 1] = noise
        extrema[i, 0] = top
        extrema[i, 1] = low
