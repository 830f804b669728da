"""LayerNorm forward and backward (chapter Listing 16.1, equations 16.1 and 16.3).

Dimension letters: B = leading dims (rows), F = the k normalised trailing dims.
The reference implementations `_layer_norm_forward_ref(x, gamma, beta, eps,
normalized_ndim)` and `_layer_norm_backward_ref(dout, cache)` are what a kernel
registered as `"layer_norm_forward"` / `"layer_norm_backward"` must reproduce.
The `_core` helpers compute in the compute dtype and are shared with the fused
residual-add variants in `normlab.norms.add_norm`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._stats import centred_grad, mean_var, rstd_from
from normlab._validate import check_eps
from normlab.norms._cache import LayerNormCache
from normlab.norms._common import (
    check_input,
    check_trailing_params,
    compute_dtype_of,
    dispatch_backward,
    dispatch_forward,
)
from normlab.norms._out import fill_grads, filled

__all__ = ["layer_norm_backward", "layer_norm_forward"]


def validate_layer_norm(
    x: Any, gamma: Any, beta: Any, eps: Any, normalized_ndim: Any
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, float, int]:
    """Check LayerNorm's arguments; return them as arrays, eps as float, k as int."""
    x = check_input(x, min_ndim=1)
    eps = check_eps(eps)
    k, gamma, beta, eps = check_trailing_params(x, eps, normalized_ndim, gamma=gamma, beta=beta)
    return x, gamma, beta, eps, k


def layer_norm_forward_core(
    x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """out (compute dtype, x's shape), mean and rstd (B) of LayerNorm over the last k dims."""
    cd = compute_dtype_of(x, gamma, beta)
    xc = x.astype(cd, copy=False)  # (*B, *F)
    red = tuple(range(x.ndim - k, x.ndim))
    mean, var = mean_var(xc, red)  # (*B, 1...)
    rstd = rstd_from(var, eps)  # (*B, 1...)
    out = (xc - mean) * rstd  # x_hat, (*B, *F)
    if gamma is not None:
        out *= gamma.astype(cd, copy=False)
    if beta is not None:
        out += beta.astype(cd, copy=False)
    lead = x.shape[: x.ndim - k]
    return out, mean.reshape(lead), rstd.reshape(lead)


def layer_norm_backward_core(
    dout: np.ndarray, cache: LayerNormCache
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """dx, dgamma, dbeta in the compute dtype (`cache.rstd.dtype`)."""
    cd = cache.rstd.dtype
    x, k = cache.x, cache.normalized_ndim
    lead, red = tuple(range(x.ndim - k)), tuple(range(x.ndim - k, x.ndim))
    bshape = cache.rstd.shape + (1,) * k
    mean, rstd = cache.mean.reshape(bshape), cache.rstd.reshape(bshape)  # (*B, 1...)
    # recompute the norm: save memory at the cost of compute
    xhat = (x.astype(cd, copy=False) - mean) * rstd  # (*B, *F)
    g = dout.astype(cd, copy=False)  # (*B, *F)
    dgamma = np.sum(g * xhat, axis=lead) if cache.gamma is not None else None  # (*F)
    dbeta = np.sum(g, axis=lead) if cache.beta is not None else None  # (*F)
    gh = g * cache.gamma.astype(cd, copy=False) if cache.gamma is not None else g
    if x.size == 0:
        return np.zeros(x.shape, cd), dgamma, dbeta
    dx = centred_grad(gh, xhat, rstd, red)  # (16.3), (*B, *F)
    return dx, dgamma, dbeta


def _layer_norm_forward_ref(
    x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float, k: int,
    dest: np.ndarray | None = None,
) -> tuple[np.ndarray, LayerNormCache]:
    out, mean, rstd = layer_norm_forward_core(x, gamma, beta, eps, k)
    cache = LayerNormCache(x, gamma, beta, mean, rstd, eps, k)
    return filled(dest, out.astype(x.dtype, copy=False)), cache


def _layer_norm_backward_ref(
    dout: np.ndarray, cache: LayerNormCache, dest: tuple[Any, ...] = (None, None, None)
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    dx, dgamma, dbeta = layer_norm_backward_core(dout, cache)
    return fill_grads(dest, dx.astype(cache.x.dtype, copy=False), (dgamma, cache.gamma),
                      (dbeta, cache.beta))


def layer_norm_forward(
    x: Any,
    gamma: Any,
    beta: Any,
    eps: float = 1e-5,
    *,
    normalized_ndim: int | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, LayerNormCache]:
    r"""Layer normalisation over the trailing dims of each example (Ba et al., 2016).

    $$
    \hat x = (x - \mu) / \sqrt{\sigma^2 + \epsilon},\quad y = \gamma \hat x + \beta
    $$

    with the mean and biased variance taken over the last `k` dims of each row.

    Parameters
    ----------
    x : numpy.ndarray
        Float array (*B, *F); float16 / bfloat16 are computed in float32.
    gamma, beta : numpy.ndarray or None
        Float arrays of shape F (= `x.shape[-k:]`), or None (no gain / no bias).
    eps : float
        Finite number > 0 added to the variance.
    normalized_ndim : int, optional
        k, the number of trailing dims to normalise. Default: `gamma.ndim` if gamma is given,
        else `beta.ndim` if beta is given, else 1.
    out : numpy.ndarray, optional
        Optional ndarray of x's shape and dtype (C-contiguous, writeable) to write the result
        into; it must not overlap x (the cache keeps x) nor gamma / beta.

    Returns
    -------
    out : numpy.ndarray
        x's shape and dtype (the `out` buffer when given).
    cache : LayerNormCache
        References and the per-row mean and rstd, for
        [layer_norm_backward][normlab.layer_norm_backward].

    Raises
    ------
    TypeError
        Non-float x, gamma or beta; non-number eps or normalized_ndim; an `out` that is not an
        ndarray of x's dtype.
    ValueError
        eps <= 0, not finite or below the compute dtype's smallest normal; gamma/beta not of
        shape F; k outside [1, x.ndim]; `out` of another shape, not C-contiguous, read-only or
        overlapping an input.

    Examples
    --------
    >>> out, cache = layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), None, None)
    >>> np.round(out, 4)
    array([[-1.2247,  0.    ,  1.2247]])

    Notes
    -----
    Statistics are accumulated in float32 or float64 with a two-pass algorithm (see
    `normlab._stats`), so rows with a large offset keep their precision; the kernels
    add float32 block sums in float64, so accuracy does not degrade with the row width.
    NaN stays in its row: a row holding NaN or inf gives NaN in that row of `out` only,
    without warnings. `eps` must be at least the smallest normal number of the compute
    dtype (1.2e-38 for float32, 2.2e-308 for float64), else `1/sqrt(var + eps)` could not
    be finite for a constant row. Big-endian input (`'>f8'`) is computed as float64 and
    returned in native byte order.
    """
    args = validate_layer_norm(x, gamma, beta, eps, normalized_ndim)
    return dispatch_forward("layer_norm_forward", _layer_norm_forward_ref, args, out,
                            gamma=args[1], beta=args[2])


def layer_norm_backward(
    dout: Any, cache: LayerNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    r"""Gradients of LayerNorm given the upstream gradient (equation 16.3).

    With $g = \bar y \odot \gamma$ and means over the normalised dims,
    $\bar x = \mathrm{rstd}\,(g - \mathrm{mean}(g) - \hat x\,\mathrm{mean}(g \hat x))$,
    $\bar\gamma = \sum_B \bar y \hat x$, $\bar\beta = \sum_B \bar y$.

    Parameters
    ----------
    dout : numpy.ndarray
        Float array of x's shape.
    cache : LayerNormCache
        The cache returned by [layer_norm_forward][normlab.layer_norm_forward].
    out : tuple, optional
        Optional tuple `(dx, dgamma, dbeta)` of buffers (each an array or None: then that result
        is new; None where the parameter is None), each of its result's shape and dtype,
        C-contiguous, writeable. dx may be `dout` itself (in place) but must not overlap x;
        dgamma and dbeta overlap nothing.

    Returns
    -------
    dx : numpy.ndarray
        x's shape and dtype (the buffer of `out` where given).

    dgamma, dbeta : numpy.ndarray or None
        Shape F in the parameter's dtype, or None when the parameter was None. An empty batch
        gives zero parameter gradients.

    Raises
    ------
    TypeError
        a cache of the wrong type or a non-float dout; `out` not a tuple of 3.
    ValueError
        dout not of x's shape; an `out` buffer of the wrong shape, layout or overlap, or given
        for a missing parameter.

    Notes
    -----
    NaN stays in its row for `dx`, but not for the parameter gradients: dgamma sums
    `dout * x_hat` over the rows, so one NaN row of x makes every entry of dgamma NaN (as
    in PyTorch); dbeta sums only `dout` and stays finite.

    Examples
    --------
    >>> x = np.array([[1.0, 2.0, 4.0]])
    >>> out, cache = layer_norm_forward(x, np.ones(3), np.zeros(3))
    >>> dx, dg, db = layer_norm_backward(np.ones_like(x), cache)
    >>> float(abs(dx.sum())) < 1e-12, db.tolist()
    (True, [1.0, 1.0, 1.0])
    """
    return dispatch_backward("layer_norm_backward", _layer_norm_backward_ref, dout, cache, out,
                             LayerNormCache, ("gamma", "beta"))
