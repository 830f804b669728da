"""Residual add fused with LayerNorm / RMSNorm (the pre-norm residual stream step).

`new_residual = x + residual` (numpy's dtype promotion of the two) and
`out = Norm(new_residual)` in x's dtype. Both outputs feed later layers, so the backward
takes the gradient arriving on each and returns the gradient of the sum, which x and
residual share: `dsum = Norm'(dout) + dresidual`.

The cache is the plain norm's cache with `cache.x` = the new residual (a reference to the
returned array), so the math is shared with `normlab.norms.layer_norm` and
`normlab.norms.rms_norm`. Kernels: `"add_layer_norm_forward"` and
`"add_rms_norm_forward"` receive the arguments of `_add_layer_norm_forward_ref(x,
residual, gamma, beta, eps, normalized_ndim)` / `_add_rms_norm_forward_ref(x, residual,
weight, eps, offset, normalized_ndim)`; the backwards also look up
`"add_layer_norm_backward"` / `"add_rms_norm_backward"` (args: dout, dresidual, cache).
With `out=` every seam gets one more argument, the validated buffer tuple (see
`normlab.norms._out`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import check_shape
from normlab.norms._cache import LayerNormCache, RMSNormCache
from normlab.norms._common import check_input, dispatch, dispatch_backward
from normlab.norms._out import add_forward_out, fill_grads, filled, seam_extra
from normlab.norms.layer_norm import (
    layer_norm_backward_core,
    layer_norm_forward_core,
    validate_layer_norm,
)
from normlab.norms.rms_norm import (
    rms_norm_backward_core,
    rms_norm_forward_core,
    validate_rms_norm,
)

__all__ = [
    "add_layer_norm_backward",
    "add_layer_norm_forward",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
]


def _check_residual(residual: Any, x: np.ndarray) -> np.ndarray:
    res = check_input(residual, "residual", min_ndim=0)
    check_shape(res, x.shape, "residual", "the shape of x: the two are added elementwise")
    return res


def _dispatch_add_forward(
    op: str, ref: Any, args: tuple[Any, ...], residual: Any, out: Any, **params: Any
) -> Any:
    """Check `residual` against x = `args[0]` (the plain norm's validated arguments) and
    the `(out, new_residual)` buffers, then run the kernel `op` or `ref(x, residual,
    *args[1:][, dest])`."""
    res = _check_residual(residual, args[0])
    dest = add_forward_out(out, args[0], res, tuple(params.items()))
    return dispatch(op, ref, args[0], res, *args[1:], *seam_extra(dest))


def _add_into(x: np.ndarray, residual: np.ndarray, dest: tuple[Any, ...]) -> np.ndarray:
    """x + residual (numpy's promotion), written into `dest[1]` when given."""
    return x + residual if dest[1] is None else np.add(x, residual, out=dest[1])


def _sum_grad(dx: np.ndarray, dresidual: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """Norm gradient plus the residual-stream gradient, added in the compute dtype."""
    if dresidual is not None:
        dx = dx + dresidual.astype(dx.dtype, copy=False)
    return dx.astype(dtype, copy=False)


def _add_layer_norm_forward_ref(
    x: np.ndarray,
    residual: np.ndarray,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    eps: float,
    k: int,
    dest: tuple[Any, ...] = (None, None),
) -> tuple[np.ndarray, np.ndarray, LayerNormCache]:
    s = _add_into(x, residual, dest)  # the new residual stream, numpy's promotion
    out, mean, rstd = layer_norm_forward_core(s, gamma, beta, eps, k)
    cache = LayerNormCache(s, gamma, beta, mean, rstd, eps, k)
    return filled(dest[0], out.astype(x.dtype, copy=False)), s, cache


def _add_layer_norm_backward_ref(
    dout: np.ndarray, dresidual: np.ndarray | None, cache: LayerNormCache,
    dest: tuple[Any, ...] = (None, None, None),
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    dx, dgamma, dbeta = layer_norm_backward_core(dout, cache)
    return fill_grads(dest, _sum_grad(dx, dresidual, cache.x.dtype), (dgamma, cache.gamma),
                      (dbeta, cache.beta))


def _add_rms_norm_forward_ref(
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray | None,
    eps: float,
    offset: float,
    k: int,
    dest: tuple[Any, ...] = (None, None),
) -> tuple[np.ndarray, np.ndarray, RMSNormCache]:
    s = _add_into(x, residual, dest)
    out, rstd = rms_norm_forward_core(s, weight, eps, offset, k)
    cache = RMSNormCache(s, weight, rstd, eps, offset, k)
    return filled(dest[0], out.astype(x.dtype, copy=False)), s, cache


def _add_rms_norm_backward_ref(
    dout: np.ndarray, dresidual: np.ndarray | None, cache: RMSNormCache,
    dest: tuple[Any, ...] = (None, None),
) -> tuple[np.ndarray, np.ndarray | None]:
    dx, dweight = rms_norm_backward_core(dout, cache)
    return fill_grads(dest, _sum_grad(dx, dresidual, cache.x.dtype), (dweight, cache.weight))


def add_layer_norm_forward(
    x: Any,
    residual: Any,
    gamma: Any,
    beta: Any,
    eps: float = 1e-5,
    *,
    normalized_ndim: int | None = None,
    out: tuple[Any, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray, LayerNormCache]:
    r"""Residual add followed by LayerNorm: `s = x + residual`, `out = LN(s)`.

    $$
    s = x + r,\quad y = \gamma \odot (s - \mu_s)/\sqrt{\sigma_s^2 + \epsilon} + \beta
    $$

    (Ba et al., 2016; the residual stream of He et al., 2015.)

    Parameters
    ----------
    x, residual : numpy.ndarray
        Float arrays of the same shape (*B, *F).
    gamma, beta, eps, normalized_ndim
        As in [layer_norm_forward][normlab.layer_norm_forward].
    out : tuple, optional
        Optional tuple `(out, new_residual)` of buffers (each an array or None: then that result
        is new), of x's shape and the result's dtype, C-contiguous, writeable. Either may be x
        or residual itself (in place); neither may overlap a parameter or the other entry. The
        cache then keeps the `new_residual` buffer.

    Returns
    -------
    out : numpy.ndarray
        LN(s), x's shape and dtype.
    new_residual : numpy.ndarray
        s, dtype = numpy's promotion of x and residual.
    cache : LayerNormCache
        The cache of LN(s): its `x` is `new_residual`.

    Raises
    ------
    TypeError, ValueError
        As [layer_norm_forward][normlab.layer_norm_forward], plus a residual that is not a float
        array of x's shape, or a bad `out` (not a tuple of 2; a buffer of the wrong shape, dtype
        or layout, read-only, or overlapping what it may not).

    Examples
    --------
    >>> out, s, cache = add_layer_norm_forward(np.ones((2, 3)), np.arange(6.0).reshape(2, 3),
    ...                                        None, None)
    >>> s[0].tolist(), np.round(out[0], 4).tolist()
    ([1.0, 2.0, 3.0], [-1.2247, 0.0, 1.2247])
    """
    args = validate_layer_norm(x, gamma, beta, eps, normalized_ndim)
    return _dispatch_add_forward("add_layer_norm_forward", _add_layer_norm_forward_ref, args,
                                 residual, out, gamma=args[1], beta=args[2])


def add_layer_norm_backward(
    dout: Any, dresidual: Any, cache: LayerNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    r"""Gradient of the fused add + LayerNorm: `dsum = LN'(dout) + dresidual`.

    Parameters
    ----------
    dout : numpy.ndarray
        Gradient on `out`.
    dresidual : numpy.ndarray or None
        Gradient on `new_residual`, or None (zero).
    cache : LayerNormCache
        From [add_layer_norm_forward][normlab.add_layer_norm_forward].
    out : tuple, optional
        Optional tuple `(dsum, dgamma, dbeta)` of buffers, as the `out` of
        [layer_norm_backward][normlab.layer_norm_backward]; dsum also must not overlap
        dresidual.

    Returns
    -------
    dsum : numpy.ndarray
        The gradient of x and of residual alike (new_residual's shape and dtype).
    dgamma, dbeta : numpy.ndarray or None
        As in [layer_norm_backward][normlab.layer_norm_backward].

    Raises
    ------
    TypeError, ValueError
        Wrong cache type, non-float or wrongly shaped gradients, a bad `out` buffer.

    Examples
    --------
    >>> out, s, cache = add_layer_norm_forward(np.ones((1, 3)), np.eye(1, 3), None, None)
    >>> dsum, _, _ = add_layer_norm_backward(np.zeros((1, 3)), np.ones((1, 3)), cache)
    >>> dsum.tolist()
    [[1.0, 1.0, 1.0]]
    """
    return dispatch_backward("add_layer_norm_backward", _add_layer_norm_backward_ref, dout,
                             cache, out, LayerNormCache, ("gamma", "beta"), residual=(dresidual,))


def add_rms_norm_forward(
    x: Any,
    residual: Any,
    weight: Any,
    eps: float = 1e-8,
    *,
    offset: float = 0.0,
    normalized_ndim: int | None = None,
    out: tuple[Any, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray, RMSNormCache]:
    r"""Residual add followed by RMSNorm: `s = x + residual`, `out = RMSNorm(s)`.

    $$
    s = x + r,\quad y = (\mathrm{offset} + w) \odot s / \sqrt{\mathrm{mean}(s^2)+\epsilon}
    $$

    (Zhang & Sennrich, 2019.)

    Parameters
    ----------
    x, residual : numpy.ndarray
        As in [add_layer_norm_forward][normlab.add_layer_norm_forward].
    weight, eps, offset, normalized_ndim
        As in [rms_norm_forward][normlab.rms_norm_forward].
    out : tuple, optional
        As in [add_layer_norm_forward][normlab.add_layer_norm_forward].

    Returns
    -------
    out : numpy.ndarray
        RMSNorm(s), x's shape and dtype.
    new_residual : numpy.ndarray
        As in [add_layer_norm_forward][normlab.add_layer_norm_forward].
    cache : RMSNormCache
        The cache of RMSNorm(s): its `x` is `new_residual`.

    Raises
    ------
    TypeError, ValueError
        As [rms_norm_forward][normlab.rms_norm_forward], plus a bad residual or a bad `out` (as
        [add_layer_norm_forward][normlab.add_layer_norm_forward]).

    Examples
    --------
    >>> out, s, _ = add_rms_norm_forward(np.full((1, 2), 1.0), np.full((1, 2), 2.0), None)
    >>> s.tolist(), np.round(out, 6).tolist()
    ([[3.0, 3.0]], [[1.0, 1.0]])
    """
    args = validate_rms_norm(x, weight, eps, offset, normalized_ndim)
    return _dispatch_add_forward("add_rms_norm_forward", _add_rms_norm_forward_ref, args,
                                 residual, out, weight=args[1])


def add_rms_norm_backward(
    dout: Any, dresidual: Any, cache: RMSNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    r"""Gradient of the fused add + RMSNorm: `dsum = RMSNorm'(dout) + dresidual`.

    Parameters
    ----------
    dout, dresidual
        As in [add_layer_norm_backward][normlab.add_layer_norm_backward].
    cache : RMSNormCache
        From [add_rms_norm_forward][normlab.add_rms_norm_forward].
    out : tuple, optional
        Optional tuple `(dsum, dweight)` of buffers, as the `out` of
        [rms_norm_backward][normlab.rms_norm_backward]; dsum also must not overlap dresidual.

    Returns
    -------
    dsum : numpy.ndarray
        As in [add_layer_norm_backward][normlab.add_layer_norm_backward].
    dweight : numpy.ndarray or None
        As in [rms_norm_backward][normlab.rms_norm_backward].

    Raises
    ------
    TypeError, ValueError
        As [add_layer_norm_backward][normlab.add_layer_norm_backward].

    Examples
    --------
    >>> out, s, cache = add_rms_norm_forward(np.ones((1, 2)), np.ones((1, 2)), None)
    >>> add_rms_norm_backward(np.zeros((1, 2)), np.ones((1, 2)), cache)[0].tolist()
    [[1.0, 1.0]]
    """
    return dispatch_backward("add_rms_norm_backward", _add_rms_norm_backward_ref, dout,
                             cache, out, RMSNormCache, ("weight",), residual=(dresidual,))
