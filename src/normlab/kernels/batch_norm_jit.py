"""BatchNorm statistics and gradient kernels (numba) for the two layouts of the feature axis.

Dimension letters: A = product of the dims before the feature axis, C features, S =
product of the dims after it (x viewed as (A, C, S) without copying); K row chunks.

* `cols`: S == 1, x is (A, C) (features last: (N, C) and channels-last). Rows are split
  into K fixed chunks (K depends on A only); each chunk keeps a per-feature Welford mean and
  M2 in float64, and the K chunks are merged in order with Chan et al.'s pairwise formula,
  so the statistics are robust (no E[x^2] - E[x]^2) and independent of the thread count.
* `acs`: S > 1, x is (A, C, S) ((N, C, H, W) with axis=1). One prange over C; each
  (a, c) row of S contiguous values gets a two-pass mean/M2 from cache, merged across a.

Accumulation is in float64 for float32 and float64 inputs. The gradient kernels return the
per-feature sums sum(dy) and sum(dy * x_hat) the same way, then a second sweep writes dx.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import FAST, jit

__all__ = [
    "acs_grad_sums",
    "acs_stats",
    "affine_acs",
    "affine_cols",
    "bn_dx_acs",
    "bn_dx_cols",
    "cols_grad_sums",
    "cols_stats",
]


@njit(cache=True)
def _merge(mean, m2, cnt, pm, pm2, pc):
    """Merge K chunk statistics (mean, M2, count) (K, C) in chunk order (Chan et al.)."""
    K, C = pm.shape
    for k in range(K):
        nb = pc[k]
        if nb == 0:
            continue
        for c in range(C):
            na = cnt
            delta = pm[k, c] - mean[c]
            tot = na + nb
            mean[c] += delta * nb / tot
            m2[c] += pm2[k, c] + delta * delta * na * nb / tot
        cnt += nb
    return cnt


@jit()
def cols_stats(x, mean, m2, K):
    """Per-feature mean and M2 (float64, (C,)) of x (A, C) over A; returns the count A."""
    A, C = x.shape
    pm = np.zeros((K, C))  # (K, C) chunk means
    pm2 = np.zeros((K, C))  # (K, C) chunk M2
    pc = np.zeros(K, np.int64)
    for k in prange(K):
        lo = (A * k) // K
        hi = (A * (k + 1)) // K
        for r in range(lo, hi):
            inv = 1.0 / (r - lo + 1)
            for c in range(C):
                v = np.float64(x[r, c])
                d = v - pm[k, c]
                pm[k, c] += d * inv
                pm2[k, c] += d * (v - pm[k, c])
        pc[k] = hi - lo
    mean[:] = 0.0
    m2[:] = 0.0
    return _merge(mean, m2, 0, pm, pm2, pc)


@jit(FAST)
def acs_stats(x, mean, m2):
    """Per-feature mean and M2 (float64, (C,)) of x (A, C, S) over A and S."""
    A, C, S = x.shape
    for c in prange(C):
        mu = 0.0
        q = 0.0
        n = 0
        for a in range(A):
            t = 0.0
            for s in range(S):
                t += np.float64(x[a, c, s])
            ma = t / S
            qa = 0.0
            for s in range(S):
                d = np.float64(x[a, c, s]) - ma
                qa += d * d
            delta = ma - mu
            tot = n + S
            mu += delta * S / tot
            q += qa + delta * delta * n * S / tot
            n = tot
        mean[c] = mu
        m2[c] = q


@jit(FAST)
def affine_cols(x, mean, rstd, gamma, beta, out):
    """out = (x - mean) * rstd * gamma + beta per feature (C,): x, out (A, C).

    Not folded into x * scale + shift: that form cancels catastrophically for a feature
    with a large mean.
    """
    A, C = x.shape
    for r in prange(A):
        for c in range(C):
            out[r, c] = (x[r, c] - mean[c]) * rstd[c] * gamma[c] + beta[c]


@jit(FAST)
def affine_acs(x, mean, rstd, gamma, beta, out):
    """out = (x - mean) * rstd * gamma + beta per feature: x, out (A, C, S)."""
    A, C, S = x.shape
    for ac in prange(A * C):
        a = ac // C
        c = ac - a * C
        mu, rs, g, b = mean[c], rstd[c], gamma[c], beta[c]
        for s in range(S):
            out[a, c, s] = (x[a, c, s] - mu) * rs * g + b


@jit(FAST)
def cols_grad_sums(dy, x, mean, rstd, K, sdy, sdyx):
    """sdy = sum_A dy, sdyx = sum_A dy * x_hat (float64, (C,)) over fixed row chunks."""
    A, C = x.shape
    p1 = np.zeros((K, C))
    p2 = np.zeros((K, C))
    for k in prange(K):
        lo = (A * k) // K
        hi = (A * (k + 1)) // K
        for r in range(lo, hi):
            for c in range(C):
                d = dy[r, c]
                p1[k, c] += d
                p2[k, c] += d * ((x[r, c] - mean[c]) * rstd[c])
    sdy[:] = 0.0
    sdyx[:] = 0.0
    for k in range(K):  # fixed order: independent of the thread count
        for c in range(C):
            sdy[c] += p1[k, c]
            sdyx[c] += p2[k, c]


@jit(FAST)
def acs_grad_sums(dy, x, mean, rstd, sdy, sdyx):
    """sdy = sum dy, sdyx = sum dy * x_hat over A and S (float64, (C,))."""
    A, C, S = x.shape
    for c in prange(C):
        t1 = 0.0
        t2 = 0.0
        mu, rs = mean[c], rstd[c]
        for a in range(A):
            for s in range(S):
                d = dy[a, c, s]
                t1 += np.float64(d)
                t2 += np.float64(d * ((x[a, c, s] - mu) * rs))
        sdy[c] = t1
        sdyx[c] = t2


@jit(FAST)
def bn_dx_cols(dy, x, mean, rstd, gamma, c1, c2, dx):
    """dx = rstd * gamma * (dy - c1 - x_hat * c2) per feature (c1, c2 (C,)): (A, C)."""
    A, C = x.shape
    for r in prange(A):
        for c in range(C):
            xh = (x[r, c] - mean[c]) * rstd[c]
            dx[r, c] = rstd[c] * gamma[c] * (dy[r, c] - c1[c] - xh * c2[c])


@jit(FAST)
def bn_dx_acs(dy, x, mean, rstd, gamma, c1, c2, dx):
    """dx = rstd * gamma * (dy - c1 - x_hat * c2) per feature: (A, C, S)."""
    A, C, S = x.shape
    for ac in prange(A * C):
        a = ac // C
        c = ac - a * C
        mu, rs, g, k1, k2 = mean[c], rstd[c], gamma[c], c1[c], c2[c]
        for s in range(S):
            xh = (x[a, c, s] - mu) * rs
            dx[a, c, s] = rs * g * (dy[a, c, s] - k1 - xh * k2)
