"""Fused GroupNorm kernels (numba): one prange over (sample, group) runs.

Dimension letters: N batch, C channels, G groups, Cg = C / G channels per group, S values
per channel (the spatial dims flattened, 1 for a 2-D input), M = Cg * S values per
(sample, group), R = N * G runs, K chunks of samples for the parameter gradients.

Layout: a C-contiguous x (N, C, *S) viewed as (R, M) without copying: run r = n * G + g is
sample n's group g, one contiguous stretch of M values, channel c = g * Cg + j at
positions [j * S, (j + 1) * S). Every array is C-contiguous and of x's dtype (float32 or
float64), except the float64 parameter-gradient partials.

Numerics, as the row kernels of [normlab.kernels.row_norms_jit][]: sums are blocked
(`BLOCK` values summed in x's dtype by a vectorised loop over a 1-d view, block sums
added in float64); the statistics are the corrected two-pass mean and variance (Chan,
Golub & LeVeque 1983, as `normlab._stats`), the variance clipped at 0 (NaN kept),
1/sqrt taken in float64.

Memory traffic. Forward reads a run from memory once (the first sum) and then from cache
(the centred sums, the output sweep) and writes out once. Backward reads x and dout once:
the first sweep forms, per channel of the run, sum(dy) and sum(dy * x_hat) (the
parameter-gradient partials), and from them the run sums sum(gamma dy) and
sum(gamma dy x_hat) of the input gradient; the second sweep writes dx. Each dout value is
read before the dx value at its place is written, so dx may be dout's memory.

Determinism: the backward runs one task per (sample chunk k, group g); task (k, g) owns
channels [g * Cg, (g + 1) * Cg) of partial row k, adding its samples in order. K depends on
the shape only (`_chunks` in `normlab.kernels.group_norm`), and the adapter sums
the K partial rows in chunk order, so results are bit-identical on any thread count (and
between the parallel and the serial twin).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import FAST, jit

__all__ = ["BLOCK", "group_norm_bwd", "group_norm_bwd_flat", "group_norm_fwd"]

BLOCK = 1024
"""Values per float32 block sum, added in float64 (as `row_norms_jit.BLOCK`; see there)."""


@njit(inline="always")
def _run_stats(x, r, eps):
    """Mean and 1/sqrt(var + eps) of run r of x (R, M), both in x's dtype.

    The same blocked, corrected two-pass sums as `row_norms_jit._ln_row`, written here
    again on purpose: numba's on-disk cache does not notice a change in a jitted helper
    imported from another file, so kernels share no compiled helpers across files.
    """
    M = x.shape[1]
    zero = x.dtype.type(0)
    t = 0.0
    for p0 in range(0, M, BLOCK):
        v = x[r, p0 : min(p0 + BLOCK, M)]  # a 1-d view: its loop vectorises
        b = zero
        for i in range(v.shape[0]):
            b += v[i]
        t += b
    mu0 = x.dtype.type(t / M)
    c = 0.0  # sum(x - mu0): M times the rounding error of mu0
    q = 0.0  # sum((x - mu0)^2)
    for p0 in range(0, M, BLOCK):
        v = x[r, p0 : min(p0 + BLOCK, M)]
        cb = zero
        qb = zero
        for i in range(v.shape[0]):
            d = v[i] - mu0
            cb += d
            qb += d * d
        c += cb
        q += qb
    cm = c / M
    var = q / M - cm * cm
    if var < 0.0:  # clipped at 0; a NaN variance stays NaN (NaN < 0 is false)
        var = 0.0
    return x.dtype.type(mu0 + cm), x.dtype.type(1.0 / np.sqrt(var + eps))


@jit(FAST)
def group_norm_fwd(x, gamma, beta, eps, G, out, mean, rstd):
    """out = (x - mean) * rstd * gamma_c + beta_c per run; fills mean (R,) and rstd (R,).

    x, out: (R, M); gamma, beta: (C,) (ones / zeros standing in for None).
    """
    R, M = x.shape
    Cg = gamma.shape[0] // G
    S = M // Cg
    for r in prange(R):
        mu, rs = _run_stats(x, r, eps)
        c0 = (r % G) * Cg
        if S == 1:  # (N, C) input: the run's gains are one contiguous slice
            xs, ys = x[r], out[r]
            gs, bs = gamma[c0 : c0 + Cg], beta[c0 : c0 + Cg]
            for p in range(M):
                ys[p] = (xs[p] - mu) * rs * gs[p] + bs[p]
        else:
            for j in range(Cg):
                gj = gamma[c0 + j]
                bj = beta[c0 + j]
                xs = x[r, j * S : (j + 1) * S]  # channel c0 + j of the run, (S,)
                ys = out[r, j * S : (j + 1) * S]
                for s in range(S):
                    ys[s] = (xs[s] - mu) * rs * gj + bj
        mean[r] = mu
        rstd[r] = rs


@jit(FAST)
def group_norm_bwd(dy, x, mean, rstd, gamma, G, dx, pg, pb):
    """dx = rstd * (g dy - mean(g dy) - x_hat mean(g dy x_hat)) per run (S > 1); pg, pb
    (K, C) float64: per sample chunk k, the per-channel sums of dy * x_hat and dy over the
    chunk's samples.

    dy, x, dx: (R, M); mean, rstd: (R,); gamma: (C,) (ones standing in for None). The
    loops are written out, not called as inlined helpers: the serial twin pays a
    reference count per array argument of each inlined call (measured 3x slower).
    """
    R, M = x.shape
    N = R // G
    K = pg.shape[0]
    Cg = gamma.shape[0] // G
    S = M // Cg
    zero = x.dtype.type(0)
    for t in prange(K * G):  # task (k, g) owns pg[k, c0:c0 + Cg] and pb[k, c0:c0 + Cg]
        k = t // G
        c0 = (t - k * G) * Cg
        pg[k, c0 : c0 + Cg] = 0.0
        pb[k, c0 : c0 + Cg] = 0.0
        for n in range((N * k) // K, (N * (k + 1)) // K):
            r = n * G + t - k * G
            mu, rs = mean[r], rstd[r]
            a = 0.0  # sum gamma dy over the run
            b = 0.0  # sum gamma dy x_hat over the run
            for j in range(Cg):
                sd = 0.0  # sum dy over channel c0 + j of the run
                sdx = 0.0  # sum dy x_hat
                for s0 in range(0, S, BLOCK):
                    s1 = min(s0 + BLOCK, S)
                    dys = dy[r, j * S + s0 : j * S + s1]  # 1-d views: the loop vectorises
                    xs = x[r, j * S + s0 : j * S + s1]
                    ab = zero
                    bb = zero
                    for i in range(xs.shape[0]):
                        d = dys[i]
                        ab += d
                        bb += d * ((xs[i] - mu) * rs)
                    sd += ab
                    sdx += bb
                pb[k, c0 + j] += sd
                pg[k, c0 + j] += sdx
                gj = np.float64(gamma[c0 + j])
                a += gj * sd
                b += gj * sdx
            a_t = x.dtype.type(a / M)
            b_t = x.dtype.type(b / M)
            for j in range(Cg):
                gj = gamma[c0 + j]
                dys = dy[r, j * S : (j + 1) * S]
                xs = x[r, j * S : (j + 1) * S]
                dxs = dx[r, j * S : (j + 1) * S]
                for s in range(S):
                    xh = (xs[s] - mu) * rs
                    dxs[s] = rs * (dys[s] * gj - a_t - xh * b_t)  # dy read, then dx written


@jit(FAST)
def group_norm_bwd_flat(dy, x, mean, rstd, gamma, G, dx, pg, pb):
    """`group_norm_bwd` for S == 1 (a 2-D (N, C) input, one value per channel): one
    loop over the run, whose gains and partials are contiguous slices."""
    R, M = x.shape
    N = R // G
    K = pg.shape[0]
    zero = x.dtype.type(0)
    for t in prange(K * G):
        k = t // G
        c0 = (t - k * G) * M
        pg[k, c0 : c0 + M] = 0.0
        pb[k, c0 : c0 + M] = 0.0
        for n in range((N * k) // K, (N * (k + 1)) // K):
            r = n * G + t - k * G
            mu, rs = mean[r], rstd[r]
            a = 0.0
            b = 0.0
            for p0 in range(0, M, BLOCK):
                p1 = min(p0 + BLOCK, M)
                dys, xs, gs = dy[r, p0:p1], x[r, p0:p1], gamma[c0 + p0 : c0 + p1]
                pgs, pbs = pg[k, c0 + p0 : c0 + p1], pb[k, c0 + p0 : c0 + p1]
                ab = zero
                bb = zero
                for i in range(xs.shape[0]):
                    d = dys[i]
                    dxh = d * ((xs[i] - mu) * rs)
                    pbs[i] += d
                    pgs[i] += dxh
                    ab += gs[i] * d
                    bb += gs[i] * dxh
                a += ab
                b += bb
            a_t = x.dtype.type(a / M)
            b_t = x.dtype.type(b / M)
            dys, xs, dxs, gs = dy[r], x[r], dx[r], gamma[c0 : c0 + M]
            for p in range(M):
                xh = (xs[p] - mu) * rs
                dxs[p] = rs * (dys[p] * gs[p] - a_t - xh * b_t)
