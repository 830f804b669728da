"""RMSNorm forward and backward (chapter Listing 16.2, equation 16.2).

Dimension letters: B = leading dims (rows), F = the k normalised trailing dims.
The references `_rms_norm_forward_ref(x, weight, eps, offset, normalized_ndim)` and
`_rms_norm_backward_ref(dout, cache)` are what kernels registered as
`"rms_norm_forward"` / `"rms_norm_backward"` must reproduce. The `_core` helpers
compute in the compute dtype and are shared with `normlab.norms.add_norm`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._stats import mean_square, rstd_from
from normlab._validate import check_eps, check_finite_real
from normlab.norms._cache import RMSNormCache
from normlab.norms._common import (
    check_input,
    check_trailing_params,
    compute_dtype_of,
    dispatch_backward,
    dispatch_forward,
)
from normlab.norms._out import fill_grads, filled

__all__ = ["rms_norm_backward", "rms_norm_forward"]


def validate_rms_norm(
    x: Any, weight: Any, eps: Any, offset: Any, normalized_ndim: Any
) -> tuple[np.ndarray, np.ndarray | None, float, float, int]:
    """Check RMSNorm's arguments; return x, weight, eps, offset, k."""
    x = check_input(x, min_ndim=1)
    eps = check_eps(eps)
    offset = check_finite_real(offset, "offset")
    k, weight, eps = check_trailing_params(x, eps, normalized_ndim, weight=weight)
    return x, weight, eps, offset, k


def _gain(weight: np.ndarray | None, offset: float, cd: np.dtype) -> np.ndarray | None:
    """offset + weight in the compute dtype; None (gain 1) when there is no weight."""
    if weight is None:
        return None
    return weight.astype(cd) + offset if offset != 0.0 else weight.astype(cd, copy=False)


def rms_norm_forward_core(
    x: np.ndarray, weight: np.ndarray | None, eps: float, offset: float, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """out (compute dtype, x's shape) and rstd (B) of RMSNorm over the last k dims."""
    cd = compute_dtype_of(x, weight)
    xc = x.astype(cd, copy=False)  # (*B, *F)
    rstd = rstd_from(mean_square(xc, tuple(range(x.ndim - k, x.ndim))), eps)  # (*B, 1...)
    out = xc * rstd  # (*B, *F)
    gain = _gain(weight, offset, cd)
    if gain is not None:
        out *= gain
    return out, rstd.reshape(x.shape[: x.ndim - k])


def rms_norm_backward_core(
    dout: np.ndarray, cache: RMSNormCache
) -> tuple[np.ndarray, np.ndarray | None]:
    """dx and dweight in the compute dtype (`cache.rstd.dtype`)."""
    cd = cache.rstd.dtype
    x, k = cache.x, cache.normalized_ndim
    lead, red = tuple(range(x.ndim - k)), tuple(range(x.ndim - k, x.ndim))
    rstd = cache.rstd.reshape(cache.rstd.shape + (1,) * k)  # (*B, 1...)
    xhat = x.astype(cd, copy=False) * rstd  # recomputed, (*B, *F)
    g = dout.astype(cd, copy=False)  # (*B, *F)
    dweight = np.sum(g * xhat, axis=lead) if cache.weight is not None else None  # (*F)
    gain = _gain(cache.weight, cache.offset, cd)
    gh = g * gain if gain is not None else g
    if x.size == 0:
        return np.zeros(x.shape, cd), dweight
    # d(x * r)/dx with r = (mean(x^2) + eps)^(-1/2): the RMS denominator only removes the
    # x_hat direction (no mean term, unlike LayerNorm)
    dx = rstd * (gh - xhat * np.mean(gh * xhat, axis=red, keepdims=True))
    return dx, dweight


def _rms_norm_forward_ref(
    x: np.ndarray, weight: np.ndarray | None, eps: float, offset: float, k: int,
    dest: np.ndarray | None = None,
) -> tuple[np.ndarray, RMSNormCache]:
    out, rstd = rms_norm_forward_core(x, weight, eps, offset, k)
    cache = RMSNormCache(x, weight, rstd, eps, offset, k)
    return filled(dest, out.astype(x.dtype, copy=False)), cache


def _rms_norm_backward_ref(
    dout: np.ndarray, cache: RMSNormCache, dest: tuple[Any, ...] = (None, None)
) -> tuple[np.ndarray, np.ndarray | None]:
    dx, dweight = rms_norm_backward_core(dout, cache)
    return fill_grads(dest, dx.astype(cache.x.dtype, copy=False), (dweight, cache.weight))


def rms_norm_forward(
    x: Any,
    weight: Any,
    eps: float = 1e-8,
    *,
    offset: float = 0.0,
    normalized_ndim: int | None = None,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, RMSNormCache]:
    r"""Root-mean-square normalisation of each row (Zhang & Sennrich, 2019).

    $$
    y = (\mathrm{offset} + w) \odot x / \sqrt{\mathrm{mean}(x^2) + \epsilon}
    $$

    `offset=1.0` gives the zero-centred gain of Gemma-style models (weights stored as
    `gain - 1`).

    Parameters
    ----------
    x : numpy.ndarray
        Float array (*B, *F); float16 / bfloat16 are computed in float32.
    weight : numpy.ndarray or None
        Float array of shape F, or None (gain 1; `offset` is then unused).
    eps : float
        Finite number > 0 added to the mean square (default 1e-8, the listing's).
    offset : float
        Finite number added to the weight.
    normalized_ndim : int, optional
        Number of trailing dims to normalise (default `weight.ndim`, or 1).
    out : numpy.ndarray, optional
        Optional ndarray of x's shape and dtype (C-contiguous, writeable) to write the result
        into; it must not overlap x (the cache keeps x) nor weight.

    Returns
    -------
    out : numpy.ndarray
        x's shape and dtype (the `out` buffer when given).
    cache : RMSNormCache
        References and the per-row rstd, for [rms_norm_backward][normlab.rms_norm_backward].

    Raises
    ------
    TypeError
        Non-float x / weight, non-number eps / offset / normalized_ndim; an `out` that is not an
        ndarray of x's dtype.
    ValueError
        eps <= 0 or not finite, offset not finite, weight not of shape F, k outside [1, x.ndim];
        `out` of another shape, not C-contiguous, read-only or overlapping an input.

    Examples
    --------
    >>> out, _ = rms_norm_forward(np.array([[3.0, 4.0]]), None, eps=1e-12)
    >>> np.round(out, 6)
    array([[0.848528, 1.131371]])
    """
    args = validate_rms_norm(x, weight, eps, offset, normalized_ndim)
    return dispatch_forward("rms_norm_forward", _rms_norm_forward_ref, args, out,
                            weight=args[1])


def rms_norm_backward(
    dout: Any, cache: RMSNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    r"""Gradients of RMSNorm.

    With $g = \bar y \odot (\mathrm{offset} + w)$ and $\hat x = x\,\mathrm{rstd}$:
    $\bar x = \mathrm{rstd}\,(g - \hat x\,\mathrm{mean}(g \hat x))$,
    $\bar w = \sum_B \bar y \hat x$.

    Parameters
    ----------
    dout : numpy.ndarray
        Float array of x's shape.
    cache : RMSNormCache
        The cache returned by [rms_norm_forward][normlab.rms_norm_forward].
    out : tuple, optional

        Optional tuple `(dx, dweight)` of buffers (each an array or None; None where there is no
        weight), of their results' shapes and dtypes, C-contiguous, writeable; dx may be `dout`
        itself but must not overlap x.

    Returns
    -------
    dx : numpy.ndarray
        x's shape and dtype (the `out` buffer where given).
    dweight : numpy.ndarray or None
        Shape F in weight's dtype, or None without weight.

    Raises
    ------
    TypeError
        Wrong cache type or non-float dout; `out` not a tuple of 2.
    ValueError
        dout not of x's shape; an `out` buffer of the wrong shape, layout or overlap, or given
        without a weight.

    Examples
    --------
    >>> out, cache = rms_norm_forward(np.array([[3.0, 4.0]]), np.ones(2))
    >>> dx, dw = rms_norm_backward(np.ones((1, 2)), cache)
    >>> dw.shape
    (2,)
    """
    return dispatch_backward("rms_norm_backward", _rms_norm_backward_ref, dout, cache, out,
                             RMSNormCache, ("weight",))
