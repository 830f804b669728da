"""BatchNorm forward/backward kernels behind the functional API (dispatch adapters).

Receive exactly the validated arguments of `_batch_norm_forward_ref(x, gamma, beta,
running_mean, running_var, training, eps, axis)` and `_batch_norm_backward_ref(dout, cache)`
(`normlab.norms.batch_norm`), return the same results with the same
[BatchNormCache][normlab.BatchNormCache], or `NotImplemented` (dtypes other than
float32/float64, parameters of another dtype than x, empty arrays).

Dimension letters: A dims before the feature axis, C features, S dims after it; x is
viewed as (A, C, S) (`np.ascontiguousarray` first when it is not C-contiguous).

Like the reference, the forward kernel is pure: it returns the batch statistics (training) and
[normlab.norms.batch_norm.batch_norm_forward][normlab.batch_norm_forward] updates the running
statistics once, for both paths.

`out=` buffers arrive validated as `dest` (C-contiguous, of x's shape and dtype, so a
view of one as (A, C, S) exists for any feature axis): the sweeps write into them
directly; the backward's parameter gradients are copied in after dx is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.kernels import batch_norm_jit as jit
from normlab.kernels._adapt import FLOATS, launch, vec
from normlab.kernels.row_norms_jit import chunk_count
from normlab.norms._cache import BatchNormCache
from normlab.norms._out import fill

__all__: list[str] = []


def _acs(x: np.ndarray, axis: int) -> np.ndarray:
    """x as a C-contiguous (A, C, S) array."""
    a = math.prod(x.shape[:axis])
    return np.ascontiguousarray(x).reshape(a, x.shape[axis], -1)


def batch_norm_forward(
    x: np.ndarray,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    training: bool,
    eps: float,
    axis: int,
    dest: np.ndarray | None = None,
) -> Any:
    """Kernel of `_batch_norm_forward_ref`: robust one-read statistics, then one sweep
    (into `dest` when given)."""
    dt = x.dtype
    if dt not in FLOATS or x.size == 0 or any(p is not None and p.dtype != dt
                                               for p in (gamma, beta)):
        return NotImplemented
    x3 = _acs(x, axis)  # (A, C, S)
    a, c, s = x3.shape
    if training:
        mean64, m2 = np.empty(c), np.empty(c)  # (C,) float64
        if s == 1:
            launch(jit.cols_stats, x.size, x3.reshape(a, c), mean64, m2, chunk_count(a))
        else:
            launch(jit.acs_stats, x.size, x3, mean64, m2)
        mean, var = mean64.astype(dt), np.maximum(m2 / (a * s), 0.0).astype(dt)
    else:
        assert running_mean is not None and running_var is not None
        mean, var = np.array(running_mean, dtype=dt), np.array(running_var, dtype=dt)
    rstd = 1.0 / np.sqrt(var + eps)  # (C,)
    g, b = vec(gamma, c, dt, 1.0), vec(beta, c, dt, 0.0)
    out = np.empty_like(x3) if dest is None else dest.reshape(a, c, s)  # (A, C, S)
    if s == 1:
        launch(jit.affine_cols, x.size, x3.reshape(a, c), mean, rstd, g, b, out.reshape(a, c))
    else:
        launch(jit.affine_acs, x.size, x3, mean, rstd, g, b, out)
    cache = BatchNormCache(x, gamma, beta, mean, rstd, axis, training, eps)
    return (out.reshape(x.shape) if dest is None else dest), cache, var


def batch_norm_backward(dout: np.ndarray, cache: BatchNormCache,
                        dest: tuple[Any, ...] | None = None) -> Any:
    """Kernel of `_batch_norm_backward_ref`: per-feature sums, then dx in one sweep.

    `dest` (validated `out=` buffers): dx is written in place; it may be dout, since
    the sums read all of dout first and the sweep reads each dout value before writing
    the dx value at the same place.
    """
    x, dt = cache.x, cache.x.dtype
    arrays = (dout, cache.gamma, cache.beta, cache.mean, cache.rstd)
    if dt not in FLOATS or x.size == 0 or any(p is not None and p.dtype != dt for p in arrays):
        return NotImplemented
    x3 = _acs(x, cache.axis)  # (A, C, S)
    a, c, s = x3.shape
    dy3 = np.ascontiguousarray(dout).reshape(x3.shape)
    sdy, sdyx = np.empty(c), np.empty(c)  # (C,) float64
    mean, rstd = np.ascontiguousarray(cache.mean), np.ascontiguousarray(cache.rstd)
    if s == 1:
        launch(jit.cols_grad_sums, x.size, dy3.reshape(a, c), x3.reshape(a, c), mean, rstd,
               chunk_count(a), sdy, sdyx)
    else:
        launch(jit.acs_grad_sums, x.size, dy3, x3, mean, rstd, sdy, sdyx)
    n = a * s
    if cache.training:  # batch statistics: LayerNorm's formula over the reduced axes
        c1, c2 = (sdy / n).astype(dt), (sdyx / n).astype(dt)
    else:  # running statistics are constants: dx = dy * gamma * rstd
        c1, c2 = np.zeros(c, dt), np.zeros(c, dt)
    g = vec(cache.gamma, c, dt, 1.0)
    dx = np.empty_like(x3) if dest is None or dest[0] is None else dest[0].reshape(a, c, s)
    if s == 1:
        launch(jit.bn_dx_cols, x.size, dy3.reshape(a, c), x3.reshape(a, c), mean, rstd, g, c1,
               c2, dx.reshape(a, c))
    else:
        launch(jit.bn_dx_acs, x.size, dy3, x3, mean, rstd, g, c1, c2, dx)
    dgamma = sdyx.astype(dt) if cache.gamma is not None else None
    dbeta = sdy.astype(dt) if cache.beta is not None else None
    if dest is None:
        return dx.reshape(x.shape), dgamma, dbeta
    return (dest[0] if dest[0] is not None else dx.reshape(x.shape),
            fill(dest[1], dgamma), fill(dest[2], dbeta))
