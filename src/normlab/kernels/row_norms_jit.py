"""Fused row kernels for LayerNorm and RMSNorm (numba, one prange over rows).

Dimension letters: R rows (every leading axis flattened), W width (the normalised trailing
axes flattened), K chunks of rows for the parameter-gradient reduction.

Contract: every array is C-contiguous and float32 or float64; the gain and bias are already
in x's dtype (ones / zeros when the layer has none), and so are `mean` / `rstd` and the
chunk partials. Row sums are blocked: each block of `BLOCK` values is summed in x's dtype
by a vectorised loop (16-64 interleaved partial sums), and the block sums are added in
float64, so the rounding error of a row sum does not grow with the width (a float32 row of
16M values is as accurate as one of 4096); 1/sqrt(var + eps) is taken in float64.

Memory traffic (the reason these kernels exist). Forward reads x once from memory and writes
out once: the row (<= a few tens of KiB) stays in L1/L2 for the second and third sweep
(two-pass variance, then the output), so there is no E[x^2] - E[x]^2 cancellation.
Backward reads x and dout once and writes dx once: the first sweep forms both row sums
sum(g * dy) and sum(g * dy * x_hat), the second writes dx and adds dy * x_hat, dy into the
chunk's parameter-gradient row. For arrays larger than a core's cache the output sweep runs
in blocks of `prefetch_jit.BLOCK_BYTES`, each preceded by prefetches of the lines
`ahead` elements on (inputs for reading, outputs for writing: see
[normlab.kernels.prefetch_jit][]), so the memory bus keeps streaming while a row is worked
on in L1. When `ahead` is 0 the sweep is one block, the whole row.

Fastmath and bit-identity: the output sweeps call one helper (`_affine`, `_scaled`,
`_ln_dx`, `_rms_dx`) from one call site, whether blocked or not. Two call sites (one per
path) gave float64 backward results that differed from the one-loop kernel by up to
thousands of ulp where dx cancels: with `reassoc`, LLVM rewrites `x_hat * (b / W)` one way
when the quotient has one use and another when it has two. One call site keeps the
arithmetic of every element the same with and without prefetching (tested bit for bit).

Determinism: parameter gradients are reduced per fixed chunk of rows (K depends only on the
shape, never on the thread count; at most 256 rows a chunk:
[chunk_count][normlab.kernels.row_norms_jit.chunk_count]), and the K partial rows are summed in
float64 in chunk order afterwards, so results are bit-identical on 1 or N threads.

`fastmath` is limited to reassociation and contraction (vectorised sums, fused
multiply-add): it changes the last bits of a sum, as any summation order does, never NaN/inf
semantics. Rounding kernels never use it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import FAST, PARALLEL_MIN_ELEMENTS, jit
from normlab.kernels.prefetch_jit import BLOCK_BYTES, read_span, write_span

__all__ = [
    "BLOCK",
    "add_layer_norm_fwd",
    "add_rms_norm_fwd",
    "chunk_count",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "rms_norm_bwd",
    "rms_norm_fwd",
]

BLOCK = 1024
"""Values per block of a row sum; the float32 block sums are added in float64.

Long enough for the vectorised loop, short enough that a float32 block sum keeps ~1e-7
relative accuracy. Each block is summed over a 1-d view with a loop from 0: LLVM vectorises
that loop, not one over `range(j0, min(j0 + BLOCK, W))` (measured 30x slower).
"""

# _ROWS: the backward's second sweep indexes 1-d row views (x[r], dx[r], pg[k], ...), not
# the 2-d arrays, and adds the residual gradient in a loop of its own (a branch or a
# conditional view in the loop stops its vectorisation): same arithmetic, 4-10% faster
# (float32 LayerNorm backward, 2 threads: (8192, 4096) 12.8 -> 12.3 ms, (65536, 1024)
# 21.9 -> 19.6 ms, means of two runs).

# Row chunks of the parameter-gradient reduction: at least 64 (work for every thread), at
# most 256 rows each (the partials are float32 sums over a chunk). Depends on R only.
_MIN_CHUNKS = 64
_SERIAL_SIZE = PARALLEL_MIN_ELEMENTS  # a constant copy: K depends on the shape only
_MAX_CHUNK_ROWS = 256


def chunk_count(rows: int, width: int | None = None) -> int:
    """Number of row chunks K of the parameter-gradient reduction (depends on the shape only).

    With `width` given and `rows * width` below `_SERIAL_SIZE` (the default launch
    threshold, fixed here: the launch policy may change at run time, K must not) the kernel
    normally runs serially, so no chunk is needed for a thread: K = ceil(R / 256), one
    chunk up to 256 rows, and the (K, W) partials stay as small as the parameter itself (a
    small-batch backward then skips a pass over R x W).
    """
    if width is not None and rows * width < _SERIAL_SIZE:
        return max(1, -(-rows // _MAX_CHUNK_ROWS))
    return max(1, min(rows, max(_MIN_CHUNKS, -(-rows // _MAX_CHUNK_ROWS))))


@njit(inline="always")
def _row_sum(a, r):
    """sum_j a[r, j] as float64: x-dtype sums of BLOCK values, added in float64."""
    W = a.shape[1]
    t = 0.0
    for j0 in range(0, W, BLOCK):
        s = a[r, j0 : min(j0 + BLOCK, W)]  # a 1-d view: its loop vectorises
        b = a.dtype.type(0)
        for j in range(s.shape[0]):
            b += s[j]
        t += b
    return t


@njit(inline="always")
def _row_sq_sum(a, r):
    """sum_j a[r, j]^2 as float64, blocked like `_row_sum`."""
    W = a.shape[1]
    t = 0.0
    for j0 in range(0, W, BLOCK):
        s = a[r, j0 : min(j0 + BLOCK, W)]
        b = a.dtype.type(0)
        for j in range(s.shape[0]):
            b += s[j] * s[j]
        t += b
    return t


@njit(inline="always")
def _add_into(a, b):
    """a += b elementwise (1-d rows; the add+norm backward's residual gradient)."""
    for j in range(a.shape[0]):
        a[j] += b[j]


@njit(inline="always")
def _affine(xs, ys, gs, bs, mu, rs):
    """ys = (xs - mu) * rs * gs + bs over 1-d views (LayerNorm's output sweep)."""
    for j in range(xs.shape[0]):
        ys[j] = (xs[j] - mu) * rs * gs[j] + bs[j]


@njit(inline="always")
def _ln_row(a, r, first_sum, gamma, beta, eps, out, mean, rstd, ahead):
    """Finish LayerNorm of row r of `a` (R, W) given its first-pass sum: stats, then out.

    The second sweep forms the corrected two-pass sums `c = sum(x - mu0)` and
    `v = sum((x - mu0)^2)` (Chan, Golub & LeVeque 1983, as in `normlab._stats`):
    `c / W` is the rounding error of the first mean, so mean and variance are corrected by
    it; the variance is clipped at 0 and 1/sqrt is taken in float64. The third sweep writes
    `out[r]`, in blocks that prefetch the lines `ahead` elements on when `ahead` > 0 (the
    same arithmetic per element). Shared by the plain and the add+norm forward.
    """
    W = a.shape[1]
    zero = a.dtype.type(0)
    mu0 = a.dtype.type(first_sum / W)
    c = 0.0
    v = 0.0
    for j0 in range(0, W, BLOCK):
        s = a[r, j0 : min(j0 + BLOCK, W)]
        cb = zero
        vb = zero
        for j in range(s.shape[0]):
            d = s[j] - mu0
            cb += d
            vb += d * d
        c += cb
        v += vb
    cm = c / W
    var = max(v / W - cm * cm, 0.0)
    mu_t, rs_t = a.dtype.type(mu0 + cm), a.dtype.type(1.0 / np.sqrt(var + eps))
    blk, base = W if ahead == 0 else BLOCK_BYTES // a.itemsize, r * W + ahead
    for j0 in range(0, W, blk):  # one block (the whole row) when ahead == 0
        j1 = min(j0 + blk, W)
        if ahead > 0:
            read_span(a, base + j0, base + j1)
            write_span(out, base + j0, base + j1)
        _affine(a[r, j0:j1], out[r, j0:j1], gamma[j0:j1], beta[j0:j1], mu_t, rs_t)
    mean[r] = mu_t
    rstd[r] = rs_t


@jit(FAST)
def layer_norm_fwd(x, gamma, beta, eps, out, mean, rstd, ahead):
    """out = (x - mean) * rstd * gamma + beta per row; fills mean (R,) and rstd (R,).

    `ahead`: prefetch distance in elements (0: none), see `normlab.kernels.prefetch_jit`.
    """
    R = x.shape[0]  # x, out: (R, W); gamma, beta: (W,)
    for r in prange(R):
        _ln_row(x, r, _row_sum(x, r), gamma, beta, eps, out, mean, rstd, ahead)


@njit(inline="always")
def _scaled(xs, ys, gs, rs):
    """ys = xs * rs * gs over 1-d views (RMSNorm's output sweep)."""
    for j in range(xs.shape[0]):
        ys[j] = xs[j] * rs * gs[j]


@njit(inline="always")
def _rms_row(a, r, gain, eps, out, rstd, ahead):
    """out[r] = a[r] * rstd * gain with rstd = 1 / sqrt(mean(a[r]^2) + eps).

    The output sweep prefetches like `_ln_row` when `ahead` > 0.
    """
    W = a.shape[1]
    rs_t = a.dtype.type(1.0 / np.sqrt(_row_sq_sum(a, r) / W + eps))
    blk, base = W if ahead == 0 else BLOCK_BYTES // a.itemsize, r * W + ahead
    for j0 in range(0, W, blk):  # one block (the whole row) when ahead == 0
        j1 = min(j0 + blk, W)
        if ahead > 0:
            read_span(a, base + j0, base + j1)
            write_span(out, base + j0, base + j1)
        _scaled(a[r, j0:j1], out[r, j0:j1], gain[j0:j1], rs_t)
    rstd[r] = rs_t


@jit(FAST)
def rms_norm_fwd(x, gain, eps, out, rstd, ahead):
    """out = x * rstd * gain per row with rstd = 1 / sqrt(mean(x^2) + eps); fills rstd (R,).

    `ahead`: prefetch distance in elements (0: none).
    """
    R = x.shape[0]  # x, out: (R, W); gain: (W,)
    for r in prange(R):
        _rms_row(x, r, gain, eps, out, rstd, ahead)


@njit(inline="always")
def _stream(x, dy, dres, dx, has_res, lo, hi):
    """Prefetch flat elements [lo, hi) of the backward's inputs (read) and of dx (write)."""
    read_span(x, lo, hi)
    read_span(dy, lo, hi)
    if has_res:
        read_span(dres, lo, hi)
    write_span(dx, lo, hi)


@njit(inline="always")
def _ln_dx(xs, dys, dxs, pgs, pbs, gs, mu, rs, a_t, b_t):
    """LayerNorm's dx sweep over 1-d views; adds dy * x_hat and dy into the chunk partials."""
    for j in range(xs.shape[0]):
        xh = (xs[j] - mu) * rs
        d = dys[j]  # read before dxs[j] is written: dx may be dy
        dxs[j] = rs * (d * gs[j] - a_t - xh * b_t)
        pgs[j] += d * xh
        pbs[j] += d


@njit(inline="always")
def _rms_dx(xs, dys, dxs, pgs, gs, rs, b_t):
    """RMSNorm's dx sweep over 1-d views; adds dy * x_hat into the chunk partials."""
    for j in range(xs.shape[0]):
        xh = xs[j] * rs
        d = dys[j]
        dxs[j] = rs * (d * gs[j] - xh * b_t)
        pgs[j] += d * xh


@jit(FAST)
def layer_norm_bwd(dy, x, mean, rstd, gamma, dres, dx, pg, pb, ahead):
    """dx = rstd * (g dy - mean(g dy) - x_hat mean(g dy x_hat)) + dres; pg, pb: (K, W).

    pg[k] and pb[k] receive sum(dy * x_hat) and sum(dy) over the rows of chunk k. `dres`
    is the residual-stream gradient of the add+norm variant (R, W), or a (0, 0) array.
    `ahead`: prefetch distance in elements (0: none) of the dx sweep.
    """
    R, W = x.shape  # dy, x, dx: (R, W); mean, rstd: (R,); gamma: (W,)
    K = pg.shape[0]
    blk = W if ahead == 0 else BLOCK_BYTES // x.itemsize
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
            a = 0.0  # sum_j g dy
            b = 0.0  # sum_j g dy x_hat
            for j0 in range(0, W, BLOCK):
                j1 = min(j0 + BLOCK, W)
                dys, xs, gs = dy[r, j0:j1], x[r, j0:j1], gamma[j0:j1]  # 1-d views
                ab = zero
                bb = zero
                for j in range(xs.shape[0]):
                    gd = dys[j] * gs[j]
                    ab += gd
                    bb += gd * ((xs[j] - mu) * rs)
                a += ab
                b += bb
            a_t = x.dtype.type(a / W)
            b_t = x.dtype.type(b / W)
            base = r * W + ahead
            for j0 in range(0, W, blk):  # one block (the whole row) when ahead == 0
                j1 = min(j0 + blk, W)
                if ahead > 0:
                    _stream(x, dy, dres, dx, has_res, base + j0, base + j1)
                _ln_dx(x[r, j0:j1], dy[r, j0:j1], dx[r, j0:j1], pg[k, j0:j1],
                       pb[k, j0:j1], gamma[j0:j1], mu, rs, a_t, b_t)  # 1-d views (_ROWS)
            if has_res:
                _add_into(dx[r], dres[r])


@jit(FAST)
def rms_norm_bwd(dy, x, rstd, gain, dres, dx, pg, ahead):
    """dx = rstd * (g dy - x_hat mean(g dy x_hat)) + dres; pg: (K, W) sums of dy * x_hat.

    `ahead`: prefetch distance in elements (0: none) of the dx sweep.
    """
    R, W = x.shape  # dy, x, dx: (R, W); rstd: (R,); gain: (W,)
    K = pg.shape[0]
    blk = W if ahead == 0 else BLOCK_BYTES // x.itemsize
    has_res = dres.shape[0] == R and R > 0
    zero = x.dtype.type(0)
    for k in prange(K):
        lo = (R * k) // K
        hi = (R * (k + 1)) // K
        for j in range(W):
            pg[k, j] = 0.0
        for r in range(lo, hi):
            rs = x.dtype.type(rstd[r])
            b = 0.0  # sum_j g dy x_hat
            for j0 in range(0, W, BLOCK):
                j1 = min(j0 + BLOCK, W)
                dys, xs, gs = dy[r, j0:j1], x[r, j0:j1], gain[j0:j1]  # 1-d views
                bb = zero
                for j in range(xs.shape[0]):
                    bb += dys[j] * gs[j] * (xs[j] * rs)
                b += bb
            b_t = x.dtype.type(b / W)
            base = r * W + ahead
            for j0 in range(0, W, blk):  # one block (the whole row) when ahead == 0
                j1 = min(j0 + blk, W)
                if ahead > 0:
                    _stream(x, dy, dres, dx, has_res, base + j0, base + j1)
                _rms_dx(x[r, j0:j1], dy[r, j0:j1], dx[r, j0:j1], pg[k, j0:j1],
                        gain[j0:j1], rs, b_t)  # 1-d views (_ROWS)
            if has_res:
                _add_into(dx[r], dres[r])


@njit(inline="always")
def _add_row(x, res, s, r):
    """s[r] = x[r] + res[r]: the new residual stream row."""
    for j in range(x.shape[1]):
        s[r, j] = x[r, j] + res[r, j]


@jit(FAST)
def add_layer_norm_fwd(x, res, gamma, beta, eps, s, out, mean, rstd):
    """s = x + res, then LayerNorm of s into out (the row of s is still in cache)."""
    R = x.shape[0]  # x, res, s, out: (R, W)
    for r in prange(R):
        _add_row(x, res, s, r)
        _ln_row(s, r, _row_sum(s, r), gamma, beta, eps, out, mean, rstd, 0)


@jit(FAST)
def add_rms_norm_fwd(x, res, gain, eps, s, out, rstd):
    """s = x + res, then RMSNorm of s into out."""
    R = x.shape[0]  # x, res, s, out: (R, W)
    for r in prange(R):
        _add_row(x, res, s, r)
        _rms_row(s, r, gain, eps, out, rstd, 0)
