"""The one statistics helper behind every norm (LayerNorm, RMSNorm, BatchNorm, GroupNorm).

Contract: the input is already in its compute dtype (at least float32, see
`normlab._validate.compute_dtype`); statistics are reduced over `axes` with
`keepdims=True` so they broadcast against the input.

The variance uses the corrected two-pass algorithm (Chan, Golub & LeVeque, "Algorithms for
computing the sample variance", 1983):

    mu_0 = mean(x),  d = x - mu_0,  c = mean(d),
    mu = mu_0 + c,   var = max(mean(d^2) - c^2, 0)

The second pass works on centred values, so there is no cancellation of the form
E[x^2] - E[x]^2 (which loses every digit of a float32 row like `randn + 2000`); the
correction `c` removes the rounding error of the first mean, which matters when NumPy
reduces along a strided axis with a naive running sum. Empty reductions (n = 0) give mean 0
and variance 0 instead of a warning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["centred_grad", "mean_square", "mean_var", "rstd_from"]


def _count(x: np.ndarray, axes: Sequence[int]) -> int:
    return math.prod(x.shape[a] for a in axes)


def _reduced_shape(x: np.ndarray, axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(1 if i in axes else n for i, n in enumerate(x.shape))


def mean_var(x: np.ndarray, axes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and biased variance of `x` over `axes` (keepdims), without cancellation.

    Parameters
    ----------
    x
        In its compute dtype (float32 or float64).
    axes
        The axes to reduce.

    Returns
    -------
    mean, var : numpy.ndarray
        Arrays of `x.dtype` with the reduced axes kept as length 1; `var >= 0` (clipped), NaN
        where the reduced slice holds a NaN.

    Examples
    --------
    >>> m, v = mean_var(np.array([[1.0, 2.0, 3.0]]), (1,))
    >>> float(m[0, 0]), round(float(v[0, 0]), 12)
    (2.0, 0.666666666667)
    """
    axes = tuple(axes)
    if _count(x, axes) == 0:
        zeros = np.zeros(_reduced_shape(x, axes), dtype=x.dtype)
        return zeros, zeros.copy()
    mean = np.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    corr = np.mean(centred, axis=axes, keepdims=True)  # rounding error of the first mean
    var = np.mean(centred * centred, axis=axes, keepdims=True) - corr * corr
    return mean + corr, np.maximum(var, 0.0)


def mean_square(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """mean(x^2) over `axes` (keepdims); 0 for an empty reduction (RMSNorm's statistic)."""
    axes = tuple(axes)
    if _count(x, axes) == 0:
        return np.zeros(_reduced_shape(x, axes), dtype=x.dtype)
    return np.mean(x * x, axis=axes, keepdims=True)


def rstd_from(var: np.ndarray, eps: float) -> np.ndarray:
    """1 / sqrt(var + eps) in `var`'s dtype (eps is a Python float, so it does not widen)."""
    return 1.0 / np.sqrt(var + eps)


def centred_grad(
    gh: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, axes: Sequence[int],
    out: np.ndarray | None = None,
) -> np.ndarray:
    r"""The input gradient of a mean/variance normalisation over `axes`.

    $$
    \bar x = \mathrm{rstd}\,(g - \mathrm{mean}(g) - \hat x\,\mathrm{mean}(g \hat x))
    $$

    (chapter equation 16.3): remove the mean direction and the x_hat direction of the scaled
    upstream gradient `g = dout * gamma`, then undo the scaling. LayerNorm, BatchNorm
    (training) and GroupNorm differ only in `axes`.

    Parameters
    ----------
    gh
        The upstream gradient times the gain, in the compute dtype.
    xhat
        The normalised input, of gh's shape.
    rstd
        Broadcasts against gh (the reduced axes of length 1).
    axes
        The normalised axes (means over them).
    out
        Optional array of gh's shape and dtype for dx; written by the last multiply only, after
        every read of gh and xhat, so it may be gh's memory.

    Returns
    -------
    dx : numpy.ndarray
        gh's shape (`out` when given).

    Examples
    --------
    >>> g = np.array([[1.0, 2.0, 3.0]]); xh = np.array([[-1.0, 0.0, 1.0]])
    >>> centred_grad(g, xh, np.ones((1, 1)), (1,)).tolist()
    [[0.0, 0.0, 0.0]]
    """
    axes = tuple(axes)
    inner = (gh - np.mean(gh, axis=axes, keepdims=True)
             - xhat * np.mean(gh * xhat, axis=axes, keepdims=True))
    result: np.ndarray = np.multiply(rstd, inner, out=out)
    return result
