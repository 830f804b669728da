"""Inverted dropout, forward and backward (chapter Listing 16.3).

Each value is kept with probability ``1 - p`` and the kept values are divided by ``1 - p``,
so ``E[dropout(x)] = x`` and inference uses the identity (Srivastava et al., "Dropout",
JMLR 2014). The forward draws ``keep = rng.random(x.shape) >= p`` and returns
``x * keep / (1 - p)`` exactly as the listing, in that order, so the same seed gives the
same mask and the same bits (including the listing's dtype behaviour). A kernel registered
as ``"inverted_dropout"`` receives the validated ``(x, drop_probability, rng)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._backend import dispatch
from normlab._validate import (
    as_float_array,
    as_native,
    check_generator,
    check_probability,
    check_shape,
)

__all__ = ["inverted_dropout", "inverted_dropout_backward"]


def _inverted_dropout_ref(
    x: np.ndarray, drop_probability: Any, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    keep = rng.random(x.shape) >= drop_probability  # bool, x's shape
    return x * keep / (1 - drop_probability), keep


def inverted_dropout(
    x: Any, drop_probability: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    r"""Zero each value with probability p and scale the survivors by 1/(1 - p).

    .. math:: y = m \odot x / (1 - p),\quad m_i \sim \mathrm{Bernoulli}(1 - p)

    Parameters
    ----------
    x : float array, any shape.
    drop_probability : p in [0, 1) (a Python or NumPy real number).
    rng : ``numpy.random.Generator``; one ``rng.random(x.shape)`` draw is consumed.

    Returns
    -------
    out : ``x * keep / (1 - p)`` (the listing's dtype rules). keep : bool mask, x's shape.

    Raises
    ------
    TypeError : non-float x, non-number p, rng not a Generator.
    ValueError : p outside [0, 1) or NaN.

    Example
    -------
    >>> out, keep = inverted_dropout(np.ones(4), 0.5, np.random.default_rng(0))
    >>> sorted(set(out.tolist())) in ([0.0, 2.0], [2.0], [0.0])
    True
    """
    x = as_native(as_float_array(x, "x"))
    check_probability(drop_probability, "drop_probability")
    rng = check_generator(rng)
    result: tuple[np.ndarray, np.ndarray] = dispatch(
        "inverted_dropout", _inverted_dropout_ref, x, drop_probability, rng
    )
    return result


def inverted_dropout_backward(
    dout: Any, keep: Any, drop_probability: float
) -> np.ndarray:
    r"""Gradient of inverted dropout: the forward's mask and scale.

    .. math:: \bar x = m \odot \bar y / (1 - p)

    Parameters
    ----------
    dout : float array. keep : the bool mask from :func:`inverted_dropout`, dout's shape.
    drop_probability : the p used in the forward, in [0, 1).

    Returns
    -------
    dx : ``dout * keep / (1 - p)``.

    Raises
    ------
    TypeError : non-float dout, non-bool keep, non-number p.
    ValueError : keep not of dout's shape, p outside [0, 1).

    Example
    -------
    >>> inverted_dropout_backward(np.ones(3), np.array([True, False, True]), 0.5).tolist()
    [2.0, 0.0, 2.0]
    """
    dout = as_native(as_float_array(dout, "dout"))
    check_probability(drop_probability, "drop_probability")
    if isinstance(keep, np.bool_):  # the mask of a 0-d x
        keep = np.asarray(keep)
    if not isinstance(keep, np.ndarray) or keep.dtype != np.bool_:
        got = f"dtype {keep.dtype}" if isinstance(keep, np.ndarray) else type(keep).__name__
        raise TypeError(f"keep must be the bool mask returned by inverted_dropout; got {got}")
    check_shape(keep, dout.shape, "keep", "the shape of dout")
    return dout * keep / (1 - drop_probability)
