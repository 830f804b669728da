"""BatchNorm forward/backward kernels behind the functional API (dispatch adapters).

Receive exactly the validated arguments of ``_batch_norm_forward_ref(x, gamma, beta,
running_mean, running_var, training, momentum, eps, axis, unbiased_running_var)`` and
``_batch_norm_backward_ref(dout, cache)`` (:mod:`normlab.norms.batch_norm`), return the same
results with the same :class:`BatchNormCache`, or ``NotImplemented`` (dtypes other than
float32/float64, parameters of another dtype than x, empty arrays).

Dimension letters: A dims before the feature axis, C features, S dims after it; x is
viewed as (A, C, S) (``np.ascontiguousarray`` first when it is not C-contiguous).

The running statistics are updated exactly as the reference does it, in NumPy (they are
(C,) vectors): ``r <- momentum * r + (1 - momentum) * batch`` in the wider of the two
dtypes, the batch variance times n / (n - 1) with ``unbiased_running_var``, and only when
the batch has more than one value per feature.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab._backend import register
from normlab._validate import compute_dtype
from normlab.kernels import _bn
from normlab.kernels._rows import chunk_count
from normlab.kernels._threads import threads_for
from normlab.norms._cache import BatchNormCache

__all__: list[str] = []

_SERVED = (np.dtype(np.float32), np.dtype(np.float64))


def _acs(x: np.ndarray, axis: int) -> np.ndarray:
    """x as a C-contiguous (A, C, S) array."""
    a = math.prod(x.shape[:axis])
    return np.ascontiguousarray(x).reshape(a, x.shape[axis], -1)


def _update(running: np.ndarray | None, batch: np.ndarray, momentum: float) -> None:
    """running <- momentum * running + (1 - momentum) * batch, in place (the listing)."""
    if running is None:
        return
    wd = np.result_type(compute_dtype(running.dtype), batch.dtype)
    running[...] = running.astype(wd) * momentum + (1.0 - momentum) * batch.astype(wd)


def _or(p: np.ndarray | None, c: int, dtype: np.dtype, fill: float) -> np.ndarray:
    return np.full(c, fill, dtype) if p is None else np.ascontiguousarray(p)


@register("batch_norm_forward")
def batch_norm_forward(
    x: np.ndarray,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    training: bool,
    momentum: float,
    eps: float,
    axis: int,
    unbiased_running_var: bool,
) -> Any:
    """Kernel of ``_batch_norm_forward_ref``: robust one-read statistics, then one sweep."""
    dt = x.dtype
    if dt not in _SERVED or x.size == 0 or any(p is not None and p.dtype != dt
                                               for p in (gamma, beta)):
        return NotImplemented
    x3 = _acs(x, axis)  # (A, C, S)
    a, c, s = x3.shape
    if training:
        mean64, m2 = np.empty(c), np.empty(c)  # (C,) float64
        with threads_for(x.size):
            if s == 1:
                _bn.cols_stats(x3.reshape(a, c), mean64, m2, chunk_count(a))
            else:
                _bn.acs_stats(x3, mean64, m2)
        n = a * s
        mean, var = mean64.astype(dt), np.maximum(m2 / n, 0.0).astype(dt)
        if n > 1:
            _update(running_mean, mean, momentum)
            _update(running_var, var * (n / (n - 1)) if unbiased_running_var else var, momentum)
    else:
        assert running_mean is not None and running_var is not None
        mean, var = np.array(running_mean, dtype=dt), np.array(running_var, dtype=dt)
    rstd = 1.0 / np.sqrt(var + eps)  # (C,)
    g, b = _or(gamma, c, dt, 1.0), _or(beta, c, dt, 0.0)
    out = np.empty_like(x3)
    with threads_for(x.size):
        if s == 1:
            _bn.affine_cols(x3.reshape(a, c), mean, rstd, g, b, out.reshape(a, c))
        else:
            _bn.affine_acs(x3, mean, rstd, g, b, out)
    cache = BatchNormCache(x, gamma, beta, mean, rstd, axis, training, eps)
    return out.reshape(x.shape), cache


@register("batch_norm_backward")
def batch_norm_backward(dout: np.ndarray, cache: BatchNormCache) -> Any:
    """Kernel of ``_batch_norm_backward_ref``: per-feature sums, then dx in one sweep."""
    x, dt = cache.x, cache.x.dtype
    arrays = (dout, cache.gamma, cache.beta, cache.mean, cache.rstd)
    if dt not in _SERVED or x.size == 0 or any(p is not None and p.dtype != dt for p in arrays):
        return NotImplemented
    x3 = _acs(x, cache.axis)  # (A, C, S)
    a, c, s = x3.shape
    dy3 = np.ascontiguousarray(dout).reshape(x3.shape)
    sdy, sdyx = np.empty(c), np.empty(c)  # (C,) float64
    mean, rstd = np.ascontiguousarray(cache.mean), np.ascontiguousarray(cache.rstd)
    with threads_for(x.size):
        if s == 1:
            _bn.cols_grad_sums(dy3.reshape(a, c), x3.reshape(a, c), mean, rstd,
                               chunk_count(a), sdy, sdyx)
        else:
            _bn.acs_grad_sums(dy3, x3, mean, rstd, sdy, sdyx)
    n = a * s
    if cache.training:  # batch statistics: LayerNorm's formula over the reduced axes
        c1, c2 = (sdy / n).astype(dt), (sdyx / n).astype(dt)
    else:  # running statistics are constants: dx = dy * gamma * rstd
        c1, c2 = np.zeros(c, dt), np.zeros(c, dt)
    g = _or(cache.gamma, c, dt, 1.0)
    dx = np.empty_like(x3)
    with threads_for(x.size):
        if s == 1:
            _bn.bn_dx_cols(dy3.reshape(a, c), x3.reshape(a, c), mean, rstd, g, c1, c2,
                           dx.reshape(a, c))
        else:
            _bn.bn_dx_acs(dy3, x3, mean, rstd, g, c1, c2, dx)
    dgamma = sdyx.astype(dt) if cache.gamma is not None else None
    dbeta = sdy.astype(dt) if cache.beta is not None else None
    return dx.reshape(x.shape), dgamma, dbeta
