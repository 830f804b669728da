"""Fused row kernels for LayerNorm and RMSNorm (numba, one prange over rows).

Dimension letters: R rows (every leading axis flattened), W width (the normalised trailing
axes flattened), K chunks of rows for the parameter-gradient reduction.

Contract: every array is C-contiguous and float32 or float64; the gain and bias are already
in x's dtype (ones / zeros when the layer has none), and so are ``mean`` / ``rstd`` and the
chunk partials. Row statistics and row sums are accumulated in x's dtype (float32 for
float32: the house minimum) by vectorised sums, i.e. 16-64 interleaved partial sums, so the
rounding error grows like sqrt(W) per lane; only 1/sqrt(var + eps) is taken in float64.

Memory traffic (the reason these kernels exist). Forward reads x once from memory and writes
out once: the row (<= a few tens of KiB) stays in L1/L2 for the second and third sweep
(two-pass variance, then the output), so there is no E[x^2] - E[x]^2 cancellation.
Backward reads x and dout once and writes dx once: the first sweep forms both row sums
sum(g * dy) and sum(g * dy * x_hat), the second writes dx and adds dy * x_hat, dy into the
chunk's parameter-gradient row.

Determinism: parameter gradients are reduced per fixed chunk of rows (K depends only on R,
never on the thread count; at most 256 rows a chunk), and the K partial rows are summed in
float64 in chunk order afterwards, so results are bit-identical on 1 or N threads.

``fastmath`` is limited to reassociation and contraction (vectorised sums, fused
multiply-add): it changes the last bits of a sum, as any summation order does, never NaN/inf
semantics. Rounding kernels never use it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = [
    "FAST",
    "add_layer_norm_fwd",
    "add_rms_norm_fwd",
    "chunk_count",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "rms_norm_bwd",
    "rms_norm_fwd",
]

# Reassociate (vectorised reductions) and contract (FMA); no nnan/ninf: NaN rows stay NaN.
FAST = {"reassoc", "contract"}

# Row chunks of the parameter-gradient reduction: at least 64 (work for every thread), at
# most 256 rows each (the partials are float32 sums over a chunk). Depends on R only.
_MIN_CHUNKS = 64
_MAX_CHUNK_ROWS = 256


def chunk_count(rows: int) -> int:
    """Number of row chunks K used by the parameter-gradient reduction (depends on R only)."""
    return max(1, min(rows, max(_MIN_CHUNKS, -(-rows // _MAX_CHUNK_ROWS))))


@njit(inline="always")
def _corrected_stats(mu0, c, v, W, eps):
    """Mean and 1/sqrt(var + eps) from the corrected two-pass sums of one row.

    ``mu0`` is the first-pass mean, ``c = sum(x - mu0)`` and ``v = sum((x - mu0)^2)`` come
    from the second sweep (Chan, Golub & LeVeque 1983, as in :mod:`normlab._stats`): ``c / W``
    is the rounding error of the vectorised float32 first sum (it grows with the row's offset,
    about one ulp of the offset for a 4096-wide row at 2000), so the mean and the variance are
    corrected by it; the variance is clipped at 0 and 1/sqrt is taken in float64 (the
    caller casts both results to its dtype).
    """
    cm = c / W
    var = max(np.float64(v) / W - np.float64(cm) * np.float64(cm), 0.0)
    return mu0 + cm, 1.0 / np.sqrt(var + eps)


@njit(inline="always")
def _ln_row(a, r, first_sum, gamma, beta, eps, out, mean, rstd):
    """Finish LayerNorm of row r of ``a`` (R, W) given its first-pass sum: stats, then out.

    The second sweep forms the corrected two-pass sums (the row is still in cache), the third
    writes ``out[r]``; ``mean[r]`` and ``rstd[r]`` receive the row statistics. Shared by the
    plain and the add+norm forward, which differ only in how the first pass reads the row.
    """
    W = a.shape[1]
    zero = a.dtype.type(0)
    mu0 = a.dtype.type(first_sum / W)
    c = zero
    v = zero
    for j in range(W):
        d = a[r, j] - mu0
        c += d
        v += d * d
    mu_c, rs_c = _corrected_stats(mu0, c, v, W, eps)
    mu_t, rs_t = a.dtype.type(mu_c), a.dtype.type(rs_c)
    for j in range(W):
        out[r, j] = (a[r, j] - mu_t) * rs_t * gamma[j] + beta[j]
    mean[r] = mu_t
    rstd[r] = rs_t


@njit(parallel=True, cache=True, fastmath=FAST)
def layer_norm_fwd(x, gamma, beta, eps, out, mean, rstd):
    """out = (x - mean) * rstd * gamma + beta per row; fills mean (R,) and rstd (R,)."""
    R, W = x.shape  # x, out: (R, W); gamma, beta: (W,)
    zero = x.dtype.type(0)
    for r in prange(R):
        t = zero
        for j in range(W):
            t += x[r, j]
        _ln_row(x, r, t, gamma, beta, eps, out, mean, rstd)


@njit(parallel=True, cache=True, fastmath=FAST)
def rms_norm_fwd(x, gain, eps, out, rstd):
    """out = x * rstd * gain per row with rstd = 1 / sqrt(mean(x^2) + eps); fills rstd (R,)."""
    R, W = x.shape  # x, out: (R, W); gain: (W,)
    zero = x.dtype.type(0)
    for r in prange(R):
        v = zero
        for j in range(W):
            v += x[r, j] * x[r, j]
        rs_t = x.dtype.type(1.0 / np.sqrt(np.float64(v) / W + eps))
        for j in range(W):
            out[r, j] = x[r, j] * rs_t * gain[j]
        rstd[r] = rs_t


@njit(parallel=True, cache=True, fastmath=FAST)
def layer_norm_bwd(dy, x, mean, rstd, gamma, dres, dx, pg, pb):
    """dx = rstd * (g dy - mean(g dy) - x_hat mean(g dy x_hat)) + dres; pg, pb: (K, W).

    pg[k] and pb[k] receive sum(dy * x_hat) and sum(dy) over the rows of chunk k. ``dres``
    is the residual-stream gradient of the add+norm variant (R, W), or a (0, 0) array.
    """
    R, W = x.shape  # dy, x, dx: (R, W); mean, rstd: (R,); gamma: (W,)
    K = pg.shape[0]
    has_res = dres.shape[0] == R and R > 0
    zero = x.dtype.type(0)
    for k in prange(K):
        lo = (R * k) // K
        hi = (R * (k + 1)) // K
        for j in range(W):
            pg[k, j] = 0.0
            pb[k, j] = 0.0
        for r in range(lo, hi):
            mu = x.dtype.type(mean[r])
            rs = x.dtype.type(rstd[r])
            a = zero  # sum_j g dy
            b = zero  # sum_j g dy x_hat
            for j in range(W):
                gd = dy[r, j] * gamma[j]
                xh = (x[r, j] - mu) * rs
                a += gd
                b += gd * xh
            a_t = a / W
            b_t = b / W
            for j in range(W):
                xh = (x[r, j] - mu) * rs
                d = dy[r, j]
                dx[r, j] = rs * (d * gamma[j] - a_t - xh * b_t)
                if has_res:
                    dx[r, j] += dres[r, j]
                pg[k, j] += d * xh
                pb[k, j] += d


@njit(parallel=True, cache=True, fastmath=FAST)
def rms_norm_bwd(dy, x, rstd, gain, dres, dx, pg):
    """dx = rstd * (g dy - x_hat mean(g dy x_hat)) + dres; pg: (K, W) sums of dy * x_hat."""
    R, W = x.shape  # dy, x, dx: (R, W); rstd: (R,); gain: (W,)
    K = pg.shape[0]
    has_res = dres.shape[0] == R and R > 0
    zero = x.dtype.type(0)
    for k in prange(K):
        lo = (R * k) // K
        hi = (R * (k + 1)) // K
        for j in range(W):
            pg[k, j] = 0.0
        for r in range(lo, hi):
            rs = x.dtype.type(rstd[r])
            b = zero  # sum_j g dy x_hat
            for j in range(W):
                b += dy[r, j] * gain[j] * (x[r, j] * rs)
            b_t = b / W
            for j in range(W):
                xh = x[r, j] * rs
                d = dy[r, j]
                dx[r, j] = rs * (d * gain[j] - xh * b_t)
                if has_res:
                    dx[r, j] += dres[r, j]
                pg[k, j] += d * xh


@njit(parallel=True, cache=True, fastmath=FAST)
def add_layer_norm_fwd(x, res, gamma, beta, eps, s, out, mean, rstd):
    """s = x + res, then LayerNorm of s into out: the residual stream read once."""
    R, W = x.shape  # x, res, s, out: (R, W)
    zero = x.dtype.type(0)
    for r in prange(R):
        t = zero
        for j in range(W):
            v = x[r, j] + res[r, j]
            s[r, j] = v
            t += v
        _ln_row(s, r, t, gamma, beta, eps, out, mean, rstd)


@njit(parallel=True, cache=True, fastmath=FAST)
def add_rms_norm_fwd(x, res, gain, eps, s, out, rstd):
    """s = x + res, then RMSNorm of s into out."""
    R, W = x.shape  # x, res, s, out: (R, W)
    zero = x.dtype.type(0)
    for r in prange(R):
        q = zero
        for j in range(W):
            v = x[r, j] + res[r, j]
            s[r, j] = v
            q += v * v
        rs_t = x.dtype.type(1.0 / np.sqrt(np.float64(q) / W + eps))
        for j in range(W):
            out[r, j] = s[r, j] * rs_t * gain[j]
        rstd[r] = rs_t
