"""BatchNorm forward and backward, training and eval (chapter Listing 16.3).

Dimension letters: C = features (the length of `x.shape[axis]`), n = number of values per
feature (the product of every other dim). Reductions run over every axis but `axis`.

Conventions (see DESIGN.md): `momentum` is the fraction of the OLD running statistic
kept (the chapter's 0.9; PyTorch's `momentum` is `1 - ours`); the running variance is
the biased batch variance unless `unbiased_running_var=True` (PyTorch's n/(n-1)).
The references `_batch_norm_forward_ref(x, gamma, beta, running_mean, running_var,
training, eps, axis[, dest])` (axis non-negative; returns `(out, cache, batch_var)`,
pure but for the validated `out=` buffer `dest`) and `_batch_norm_backward_ref(dout,
cache[, dest])` (`dest`: the validated `(dx, dgamma, dbeta)` tuple) are what kernels
registered as `"batch_norm_forward"` / `"batch_norm_backward"` must reproduce. The running
statistics are updated once, by [batch_norm_forward][normlab.batch_norm_forward], from the batch
statistics the
reference or the kernel returned.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._stats import centred_grad, mean_var, rstd_from
from normlab._validate import (
    as_float_array,
    check_bool,
    check_eps,
    check_int,
    check_probability,
    check_shape,
    compute_dtype,
)
from normlab.norms._cache import BatchNormCache
from normlab.norms._common import (
    check_input,
    check_params,
    compute_dtype_of,
    dispatch_backward,
    dispatch_forward,
)
from normlab.norms._out import fill_grads, filled

__all__ = ["batch_norm_backward", "batch_norm_forward"]


def _check_running(value: Any, name: str, c: int, training: bool) -> np.ndarray | None:
    """A running statistic: a writable float ndarray of shape (C,); None only in training."""
    if value is None:
        if training:
            return None
        raise ValueError(
            f"{name} is required in eval mode (training=False): eval normalises with the "
            "running statistics; got None"
        )
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy array of shape ({c},) (it is updated in place); "
            f"got {type(value).__name__}"
        )
    arr = as_float_array(value, name)
    check_shape(arr, (c,), name, "one statistic per feature of x along axis")
    if training and not arr.flags.writeable:
        raise ValueError(f"{name} must be writable: training updates it in place; got a "
                         "read-only array")
    return arr


def _validate(
    x: Any, gamma: Any, beta: Any, running_mean: Any, running_var: Any, training: Any,
    momentum: Any, eps: Any, axis: Any, unbiased: Any,
) -> tuple[Any, ...]:
    x = check_input(x, min_ndim=1)
    axis = check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}; "
                         f"got {axis}")
    ax = axis % x.ndim
    training = check_bool(training, "training")
    unbiased = check_bool(unbiased, "unbiased_running_var")
    momentum = check_probability(momentum, "momentum", allow_one=True)
    eps = check_eps(eps)
    c = x.shape[ax]
    what = f"one value per feature, x.shape[{axis}] = {c}"
    gamma, beta, eps = check_params(x, eps, (c,), what, gamma=gamma, beta=beta)
    rm = _check_running(running_mean, "running_mean", c, training)
    rv = _check_running(running_var, "running_var", c, training)
    if rm is not None and rv is not None and np.shares_memory(rm, rv):
        raise ValueError("running_mean and running_var must be two separate arrays (each is "
                         "updated in place); got arrays that share memory")
    if rv is not None and bool(np.any(rv < 0)):
        raise ValueError(f"running_var must be >= 0; got a minimum of {np.min(rv)!r}")
    n = x.size // c if c else 0
    if training and n == 1:
        raise ValueError(
            f"x: a training batch needs more than one value per feature to estimate a "
            f"variance (as in PyTorch); got shape {x.shape} with axis={axis}. Use a larger "
            "batch or eval mode."
        )
    return x, gamma, beta, rm, rv, training, momentum, eps, ax, unbiased


def _update(running: np.ndarray | None, batch: np.ndarray, momentum: float) -> None:
    """running <- momentum * running + (1 - momentum) * batch, in place (the listing)."""
    if running is None:
        return
    wd = np.result_type(compute_dtype(running.dtype), batch.dtype)
    running[...] = running.astype(wd) * momentum + (1.0 - momentum) * batch.astype(wd)


def _batch_norm_forward_ref(
    x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
    running_mean: np.ndarray | None, running_var: np.ndarray | None, training: bool,
    eps: float, axis: int, dest: np.ndarray | None = None,
) -> tuple[np.ndarray, BatchNormCache, np.ndarray]:
    """out (`dest` when given), cache and the biased batch variance (C,) (the running
    variance in eval)."""
    cd = compute_dtype_of(x, gamma, beta)
    c = x.shape[axis]
    red = tuple(i for i in range(x.ndim) if i != axis)
    bshape = tuple(c if i == axis else 1 for i in range(x.ndim))  # broadcasts (C,) against x
    xc = x.astype(cd, copy=False)
    if training:
        m, v = mean_var(xc, red)
        mean, var = m.reshape(c), v.reshape(c)  # (C,)
    else:
        assert running_mean is not None and running_var is not None  # checked by _validate
        mean = np.array(running_mean, dtype=cd)  # a copy: later updates must not leak in
        var = np.array(running_var, dtype=cd)
    rstd = rstd_from(var, eps)  # (C,)
    out = (xc - mean.reshape(bshape)) * rstd.reshape(bshape)
    if gamma is not None:
        out *= gamma.astype(cd, copy=False).reshape(bshape)
    if beta is not None:
        out += beta.astype(cd, copy=False).reshape(bshape)
    cache = BatchNormCache(x, gamma, beta, mean, rstd, axis, training, eps)
    return filled(dest, out.astype(x.dtype, copy=False)), cache, var


def _batch_norm_backward_ref(
    dout: np.ndarray, cache: BatchNormCache, dest: tuple[Any, ...] = (None, None, None)
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    x, ax, cd = cache.x, cache.axis, cache.rstd.dtype
    red = tuple(i for i in range(x.ndim) if i != ax)
    bshape = tuple(x.shape[ax] if i == ax else 1 for i in range(x.ndim))
    rstd = cache.rstd.reshape(bshape)
    xhat = (x.astype(cd, copy=False) - cache.mean.reshape(bshape)) * rstd  # recomputed
    g = dout.astype(cd, copy=False)
    dgamma = np.sum(g * xhat, axis=red) if cache.gamma is not None else None  # (C,)
    dbeta = np.sum(g, axis=red) if cache.beta is not None else None  # (C,)
    gh = g * cache.gamma.astype(cd, copy=False).reshape(bshape) if cache.gamma is not None else g
    if x.size == 0:
        dx = np.zeros(x.shape, cd)
    elif cache.training:
        # batch statistics depend on every x in the feature: LayerNorm's formula over `red`
        dx = centred_grad(gh, xhat, rstd, red)
    else:
        dx = gh * rstd  # eval: the running statistics are constants
    return fill_grads(dest, dx.astype(x.dtype, copy=False), (dgamma, cache.gamma),
                      (dbeta, cache.beta))


def batch_norm_forward(
    x: Any,
    gamma: Any,
    beta: Any,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
    training: bool,
    momentum: float = 0.9,
    eps: float = 1e-5,
    *,
    axis: int = -1,
    unbiased_running_var: bool = False,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, BatchNormCache]:
    r"""Batch normalisation of each feature over the batch (Ioffe & Szegedy, 2015).

    $$
    \hat x = (x - \mu_c)/\sqrt{\sigma_c^2 + \epsilon},\quad y = \gamma_c \hat x + \beta_c
    $$

    Training: batch mean and biased variance over every axis but `axis`, and in place
    `r <- momentum * r + (1 - momentum) * batch_stat` (running variance times n/(n-1)
    with `unbiased_running_var`). Eval: the running statistics.

    Parameters
    ----------
    x : numpy.ndarray
        Float array with C features on `axis` ((N, C) or channels-last by default; `axis=1` for
        (N, C, H, W)).
    gamma, beta : numpy.ndarray or None
        (C,) float arrays, or None (no gain / no bias).
    running_mean, running_var : numpy.ndarray or None
        Writable float arrays (C,), updated in place in training; None allowed in training
        (not tracked), required in eval.
    training : bool
        Batch statistics (True) or the running ones (False).
    momentum : float
        Fraction of the old statistic kept, in [0, 1].
    eps : float
        Finite number > 0 added to the variance.
    axis : int
        The feature axis (any, negative counts from the end).
    unbiased_running_var : bool
        Update the running variance with n/(n-1) times the batch one (as PyTorch).
    out : numpy.ndarray, optional
        Optional ndarray of x's shape and dtype (C-contiguous, writeable) to write the result
        into, whatever `axis` is; it must not overlap x (the cache keeps x), gamma, beta nor the
        running statistics.

    Returns
    -------
    out : numpy.ndarray
        x's shape and dtype (the `out` buffer when given).
    cache : BatchNormCache
        References and the per-feature statistics, for
        [batch_norm_backward][normlab.batch_norm_backward].

    Raises
    ------
    TypeError
        Non-float arrays, non-array running statistics, non-bool flags; an `out` that is not an
        ndarray of x's dtype.
    ValueError
        Wrong shapes, eps <= 0, momentum outside [0, 1], negative running_var, a read-only
        running statistic in training, or a training batch with one value per feature; `out` of
        another shape, not C-contiguous, read-only or overlapping an input. Nothing is updated
        (neither `out` nor the running statistics) when an error is raised.

    Examples
    --------
    >>> rm, rv = np.zeros(2), np.ones(2)
    >>> out, _ = batch_norm_forward(np.array([[0.0, 1.0], [2.0, 3.0]]), None, None, rm, rv, True)
    >>> np.round(rm, 6).tolist(), np.round(out[:, 0], 4).tolist()
    ([0.1, 0.2], [-1.0, 1.0])
    """
    x, gamma, beta, rm, rv, training, momentum, eps, ax, unbiased = _validate(
        x, gamma, beta, running_mean, running_var, training, momentum, eps, axis,
        unbiased_running_var)
    y, cache, var = dispatch_forward(
        "batch_norm_forward", _batch_norm_forward_ref,
        (x, gamma, beta, rm, rv, training, eps, ax), out,
        gamma=gamma, beta=beta, running_mean=rm, running_var=rv)
    n = x.size // x.shape[ax] if x.shape[ax] else 0
    if training and n > 1:  # an empty batch teaches nothing: running statistics stay
        _update(rm, cache.mean, momentum)
        _update(rv, var * (n / (n - 1)) if unbiased else var, momentum)
    return y, cache


def batch_norm_backward(
    dout: Any, cache: BatchNormCache, *, out: tuple[Any, ...] | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    r"""Gradients of BatchNorm in training (batch statistics) or eval (constants).

    Training: $\bar x = \mathrm{rstd}(g - \mathrm{mean}(g) - \hat x\,\mathrm{mean}(g\hat x))$
    with $g = \bar y\gamma$ and means over every axis but `axis`; eval:
    $\bar x = g\,\mathrm{rstd}$. $\bar\gamma = \sum \bar y\hat x$,
    $\bar\beta = \sum \bar y$.

    Parameters
    ----------
    dout : numpy.ndarray
        Float array of x's shape.
    cache : BatchNormCache
        From [batch_norm_forward][normlab.batch_norm_forward].
    out : tuple, optional
        Optional tuple `(dx, dgamma, dbeta)` of buffers (each an array or None: then that result
        is new; None where the parameter is None), each of its result's shape and dtype,
        C-contiguous, writeable. dx may be `dout` itself (in place: every dout value is read for
        the per-feature sums before any dx value is written, and each dx value is written after
        its dout value is read) but must not overlap x; dgamma and dbeta overlap nothing.

    Returns
    -------
    dx : numpy.ndarray
        x's shape and dtype (the buffer of `out` where given).
    dgamma, dbeta : numpy.ndarray or None
        (C,) in the parameter's dtype, or None when the parameter was None (the buffers of
        `out` where given).

    Raises
    ------
    TypeError
        Wrong cache type or non-float dout; `out` not a tuple of 3.

    ValueError
        dout not of x's shape; an `out` buffer of the wrong shape, layout or overlap, or given
        for a missing parameter.

    Examples
    --------
    >>> x = np.array([[0.0, 1.0], [2.0, 5.0]])
    >>> out, cache = batch_norm_forward(x, np.ones(2), np.zeros(2), None, None, True)
    >>> batch_norm_backward(np.ones_like(x), cache)[2].tolist()
    [2.0, 2.0]
    """
    return dispatch_backward("batch_norm_backward", _batch_norm_backward_ref, dout, cache, out,
                             BatchNormCache, ("gamma", "beta"))
