"""GroupNorm forward/backward kernels behind the functional API (dispatch adapters).

Receive exactly the validated arguments of `_group_norm_forward_ref(x, num_groups, gamma,
beta, eps[, dest])` and `_group_norm_backward_ref(dout, cache[, dest])`
(`normlab.norms.group_norm`), return the same results with the same
[GroupNormCache][normlab.GroupNormCache] (x by reference, mean and rstd (N, G) in x's dtype), or
`NotImplemented`: dtypes other than float32/float64 (float16 is computed in float32 by
the reference), parameters, gradients or statistics of another dtype than x, and empty
arrays. An x or dout that is not C-contiguous is copied with `np.ascontiguousarray`
first (one extra pass each; the cache still keeps the caller's x), as the other norm
kernels do, so a strided x gives the bits of its contiguous copy.

Dimension letters: N batch, C channels, G groups, R = N * G runs of M = (C / G) * S values
(S the spatial dims flattened), K sample chunks of the parameter-gradient reduction; see
[normlab.kernels.group_norm_jit][] for the layout and the summation order.

`out=` buffers arrive validated as `dest` (C-contiguous, of x's shape and dtype): the
kernels write into them directly; dx may be dout itself (each dout value is read before
the dx value at its place is written). The parameter gradients are reduced from the
chunk partials, then copied into their buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels import group_norm_jit as jit
from normlab.kernels._adapt import PARALLEL_MIN_ELEMENTS, launch, reduce_chunks, same_dtype, vec
from normlab.norms._cache import GroupNormCache
from normlab.norms._out import fill

__all__: list[str] = []  # the kernels are reached through normlab._backend only

_SERIAL_SIZE = PARALLEL_MIN_ELEMENTS  # a constant copy: K depends on the shape only
_TASKS = 64  # (chunk, group) tasks to aim for: work for every thread
_MIN_PER_CHANNEL = 16  # values a chunk sums per channel, at least: the partials stay small


def _chunks(n: int, c: int, groups: int, size: int) -> int:
    """Sample chunks K of the parameter-gradient partials (a function of the shape only).

    One chunk below the serial size (the (1, C) partials cost nothing); else enough
    chunks for about `_TASKS` (chunk, group) tasks, but each chunk summing at least
    `_MIN_PER_CHANNEL` values per channel, so the two (K, C) float64 partials stay at
    most a quarter of a float32 x's size even for a 2-D (N, C) input.
    """
    if size < _SERIAL_SIZE:
        return 1
    per_channel = size // c  # N * S values summed per channel
    return max(1, min(n, -(-_TASKS // groups), -(-per_channel // _MIN_PER_CHANNEL)))


def _runs(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, C, *S) as a C-contiguous (R, M) = (N * G, (C / G) * S) array (a view when a
    is C-contiguous)."""
    r = a.shape[0] * groups
    return np.ascontiguousarray(a).reshape(r, a.size // r)


def group_norm_forward(
    x: np.ndarray, num_groups: int, gamma: np.ndarray | None, beta: np.ndarray | None,
    eps: float, dest: np.ndarray | None = None,
) -> Any:
    """Kernel of `_group_norm_forward_ref`: one fused sweep per run (into `dest`)."""
    if not same_dtype(x, gamma, beta):
        return NotImplemented
    dt, c = x.dtype, x.shape[1]
    x2 = _runs(x, num_groups)  # (R, M)
    out = np.empty_like(x2) if dest is None else _runs(dest, num_groups)
    mean, rstd = np.empty(x2.shape[0], dt), np.empty(x2.shape[0], dt)  # (R,)
    g, b = vec(gamma, c, dt, 1.0), vec(beta, c, dt, 0.0)  # (C,)
    launch(jit.group_norm_fwd, x.size, x2, g, b, eps, num_groups, out, mean, rstd)
    stats = (x.shape[0], num_groups)
    cache = GroupNormCache(x, gamma, beta, mean.reshape(stats), rstd.reshape(stats),
                           num_groups, eps)
    return (out.reshape(x.shape) if dest is None else dest), cache


def group_norm_backward(dout: np.ndarray, cache: GroupNormCache,
                        dest: tuple[Any, ...] | None = None) -> Any:
    """Kernel of `_group_norm_backward_ref`: per-channel and per-run sums in one sweep,
    then dx (into `dest[0]` when given, which may be dout)."""
    x, groups = cache.x, cache.num_groups
    if not same_dtype(x, dout, cache.gamma, cache.beta, cache.mean, cache.rstd):
        return NotImplemented
    n, c = x.shape[0], x.shape[1]
    x2 = _runs(x, groups)  # (R, M)
    dy = _runs(dout, groups)  # (R, M)
    dx = np.empty_like(x2) if dest is None or dest[0] is None else _runs(dest[0], groups)
    kk = _chunks(n, c, groups, x.size)
    pg, pb = np.empty((kk, c)), np.empty((kk, c))  # (K, C) float64 partials
    mean = np.ascontiguousarray(cache.mean).reshape(-1)  # (R,)
    rstd = np.ascontiguousarray(cache.rstd).reshape(-1)
    kern = jit.group_norm_bwd_flat if x.size == n * c else jit.group_norm_bwd  # S == 1?
    launch(kern, x.size, dy, x2, mean, rstd, vec(cache.gamma, c, x.dtype, 1.0), groups, dx,
           pg, pb)
    dgamma, dbeta = reduce_chunks(pg, cache.gamma), reduce_chunks(pb, cache.beta)
    if dest is None:
        return dx.reshape(x.shape), dgamma, dbeta
    return (dest[0] if dest[0] is not None else dx.reshape(x.shape),
            fill(dest[1], dgamma), fill(dest[2], dbeta))
