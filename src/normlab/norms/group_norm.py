"""GroupNorm forward and backward on (N, C, *S), as `torch.nn.functional.group_norm`.

Dimension letters: N = batch, C = channels, G = groups, S = spatial dims, and
m = (C / G) * prod(S) values per (sample, group). Each sample's channels are split into G
contiguous groups; each group is normalised with its own mean and biased variance, then
scaled and shifted per channel. GroupNorm with G = 1 is LayerNorm over (C, *S) with a
per-channel affine; with G = C it is InstanceNorm (Wu & He, "Group Normalization", 2018).

The references `_group_norm_forward_ref(x, g, gamma, beta, eps[, dest])` and
`_group_norm_backward_ref(dout, cache[, dest])` (`dest`: the validated `out=`
buffer, or `(dx, dgamma, dbeta)` tuple) are what kernels registered as
`"group_norm_forward"` / `"group_norm_backward"` must reproduce.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab._stats import centred_grad, mean_var, rstd_from
from normlab._validate import check_eps, check_int
from normlab.norms._cache import GroupNormCache
from normlab.norms._common import (
    check_input,
    check_params,
    compute_dtype_of,
    dispatch_backward,
    dispatch_forward,
)
from normlab.norms._out import fill_grads, filled

__all__ = ["group_norm_backward", "group_norm_forward"]


def _grouped(a: np.ndarray, g: int) -> np.ndarray:
    """(N, C, *S) -> (N, G, m): a view for contiguous inputs."""
    per_group = (a.shape[1] // g) * math.prod(a.shape[2:])  # explicit: N may be 0
    return a.reshape(a.shape[0], g, per_group)


def _per_channel(p: np.ndarray, x: np.ndarray, cd: np.dtype) -> np.ndarray:
    """(C,) -> (1, C, 1, ...) so a channel parameter broadcasts against (N, C, *S)."""
    return p.astype(cd, copy=False).reshape((1, x.shape[1]) + (1,) * (x.ndim - 2))


def _xhat(x: np.ndarray, mean: np.ndarray, rstd: np.ndarray, g: int,
          into: np.ndarray | None = None) -> np.ndarray:
    """The normalised input in the stats' dtype, shape (N, C, *S) (written into `into`,
    a C-contiguous array of that shape and dtype, when given)."""
    xg = _grouped(x.astype(rstd.dtype, copy=False), g)  # (N, G, m)
    if into is None:
        return ((xg - mean[:, :, None]) * rstd[:, :, None]).reshape(x.shape)
    og = _grouped(into, g)  # a view of into
    np.subtract(xg, mean[:, :, None], out=og)
    np.multiply(og, rstd[:, :, None], out=og)  # the same two roundings as without into
    return into


def _direct(dest: np.ndarray | None, cd: np.dtype) -> np.ndarray | None:
    """The `out=` buffer when results can be computed in it (x's dtype is the compute
    dtype), else None (computed, then cast and copied in)."""
    return dest if dest is not None and dest.dtype == cd else None


def _validate_group_norm(
    x: Any, num_groups: Any, gamma: Any, beta: Any, eps: Any
) -> tuple[np.ndarray, int, np.ndarray | None, np.ndarray | None, float]:
    """Check GroupNorm's arguments; return x, G, gamma, beta, eps."""
    x = check_input(x, min_ndim=2)
    g = check_int(num_groups, "num_groups", minimum=1)
    c = x.shape[1]
    if c % g:
        raise ValueError(
            f"num_groups must divide the number of channels C = x.shape[1] = {c}; got {g}"
        )
    eps = check_eps(eps)
    what = f"one value per channel, C = x.shape[1] = {c}"
    gamma, beta, eps = check_params(x, eps, (c,), what, gamma=gamma, beta=beta)
    return x, g, gamma, beta, eps


def _group_norm_forward_ref(
    x: np.ndarray, g: int, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float,
    dest: np.ndarray | None = None,
) -> tuple[np.ndarray, GroupNormCache]:
    cd = compute_dtype_of(x, gamma, beta)
    m, v = mean_var(_grouped(x.astype(cd, copy=False), g), (2,))  # (N, G, 1)
    mean, rstd = m[:, :, 0], rstd_from(v, eps)[:, :, 0]  # (N, G)
    out = _xhat(x, mean, rstd, g, _direct(dest, cd))  # (N, C, *S)
    if gamma is not None:
        out *= _per_channel(gamma, x, cd)
    if beta is not None:
        out += _per_channel(beta, x, cd)
    cache = GroupNormCache(x, gamma, beta, mean, rstd, g, eps)
    return filled(dest, out.astype(x.dtype, copy=False)), cache


def _group_norm_backward_ref(
    dout: np.ndarray, cache: GroupNormCache, dest: tuple[Any, ...] = (None, None, None)
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    x, g, cd = cache.x, cache.num_groups, cache.rstd.dtype
    xhat = _xhat(x, cache.mean, cache.rstd, g)  # recomputed, (N, C, *S)
    gd = dout.astype(cd, copy=False)
    chan = (0, *range(2, x.ndim))  # every axis but C
    dgamma = np.sum(gd * xhat, axis=chan) if cache.gamma is not None else None  # (C,)
    dbeta = np.sum(gd, axis=chan) if cache.beta is not None else None  # (C,)
    h = gd * _per_channel(cache.gamma, x, cd) if cache.gamma is not None else gd
    into = _direct(dest[0], cd)
    if x.size == 0:
        dx = np.zeros(x.shape, cd)
    else:  # dx may be dout's memory: written by the last multiply, after every read of h
        hg, xg = _grouped(h, g), _grouped(xhat, g)  # (N, G, m)
        dx = centred_grad(hg, xg, cache.rstd[:, :, None], (2,),
                          None if into is None else _grouped(into, g))  # (N, G, m)
    dx_out = into if into is not None else dx.reshape(x.shape).astype(x.dtype, copy=False)
    return fill_grads(dest, dx_out, (dgamma, cache.gamma), (dbeta, cache.beta))


def group_norm_forward(
    x: Any, num_groups: int, gamma: Any, beta: Any, eps: float = 1e-5, *,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, GroupNormCache]:
    r"""Group normalisation (Wu & He, 2018).

    $$
    \hat x_{n,c,s} = (x_{n,c,s} - \mu_{n,g(c)})/\sqrt{\sigma^2_{n,g(c)} + \epsilon},
    \quad y = \gamma_c \hat x + \beta_c
    $$

    Parameters
    ----------
    x : numpy.ndarray
        Float array (N, C, *S), at least 2-D.
    num_groups : int
        G >= 1 dividing C.
    gamma, beta : numpy.ndarray or None
        (C,) float arrays, or None (no gain / no bias).
    eps : float
        Finite number > 0 added to the variance.
    out : numpy.ndarray, optional
        As in [layer_norm_forward][normlab.layer_norm_forward].

    Returns
    -------
    out : numpy.ndarray
        As in [layer_norm_forward][normlab.layer_norm_forward].
    cache : GroupNormCache
        References and the per-(sample, group) mean and rstd of shape (N, G), for
        [group_norm_backward][normlab.group_norm_backward].

    Raises
    ------
    TypeError
        Non-float arrays, non-integer num_groups, non-number eps; an `out` that is not an
        ndarray of x's dtype.
    ValueError
        x with fewer than 2 dims, num_groups < 1 or not dividing C, gamma/beta not of shape
        (C,), eps <= 0 or not finite; `out` of another shape, not C-contiguous, read-only or
        overlapping an input.

    Examples
    --------
    >>> x = np.arange(8.0).reshape(1, 4, 2)
    >>> out, cache = group_norm_forward(x, 2, None, None)
    >>> cache.mean.tolist()
    [[1.5, 5.5]]
    """
    args = _validate_group_norm(x, num_groups, gamma, beta, eps)
    return dispatch_forward("group_norm_forward", _group_norm_forward_ref, args, out,
                            gamma=args[2], beta=args[3])


def group_norm_backward(
    dout: Any, cache: GroupNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    r"""Gradients of GroupNorm: LayerNorm's backward within each (sample, group).

    With $h = \bar y \gamma_c$ viewed as (N, G, m):
    $\bar x = \mathrm{rstd}(h - \mathrm{mean}(h) - \hat x\,\mathrm{mean}(h\hat x))$;
    $\bar\gamma_c = \sum_{n,s} \bar y \hat x$, $\bar\beta_c = \sum_{n,s} \bar y$.

    Parameters
    ----------
    dout : numpy.ndarray
        Float array of x's shape.
    cache : GroupNormCache
        From [group_norm_forward][normlab.group_norm_forward].
    out : tuple, optional
        Optional tuple `(dx, dgamma, dbeta)` of buffers (each an array or None: then that result
        is new; None where the parameter is None), each of its result's shape and dtype,
        C-contiguous, writeable. dx may be `dout` itself (in place: dx is written after every
        gradient has been computed from dout) but must not overlap x; dgamma and dbeta overlap
        nothing.

    Returns
    -------
    dx : numpy.ndarray
        As in [batch_norm_backward][normlab.batch_norm_backward].
    dgamma, dbeta : numpy.ndarray or None
        As in [batch_norm_backward][normlab.batch_norm_backward] (one per channel).

    Raises
    ------
    TypeError, ValueError
        As [batch_norm_backward][normlab.batch_norm_backward].

    Examples
    --------
    >>> x = np.arange(8.0).reshape(1, 4, 2)
    >>> out, cache = group_norm_forward(x, 2, np.ones(4), np.zeros(4))
    >>> group_norm_backward(np.ones_like(x), cache)[2].tolist()
    [2.0, 2.0, 2.0, 2.0]
    """
    return dispatch_backward("group_norm_backward", _group_norm_backward_ref, dout, cache, out,
                             GroupNormCache, ("gamma", "beta"))
