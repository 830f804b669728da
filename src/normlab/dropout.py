"""Inverted dropout, forward and backward (chapter Listing 16.3).

Each value is kept with probability `1 - p` and the kept values are divided by `1 - p`,
so `E[dropout(x)] = x` and inference uses the identity (Srivastava et al., "Dropout",
JMLR 2014). The forward draws `keep = rng.random(x.shape) >= p` and returns
`x * keep / (1 - p)` exactly as the listing, in that order, so the same seed gives the
same mask and the same bits (including the listing's dtype behaviour). A kernel registered
as `"inverted_dropout"` receives the validated `(x, drop_probability, rng)`, plus the
validated `out=` tuple `(out, keep)` when one was given.

`out=` (NumPy's convention): the forward takes a tuple `(out, keep)` with an array or
None per result, the backward one array; each of the result's shape and dtype (the
listing's dtype rules), C-contiguous, writeable. `out` may be x itself and the backward's
dx may be dout itself (elementwise: each element is read before it is written); nothing may
overlap the mask or another buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._backend import dispatch
from normlab._validate import (
    as_float_array,
    as_native,
    check_generator,
    check_out,
    check_out_tuple,
    check_probability,
    check_shape,
)
from normlab.norms._out import fill

__all__ = ["inverted_dropout", "inverted_dropout_backward"]


def _inverted_dropout_ref(
    x: np.ndarray, drop_probability: Any, rng: np.random.Generator,
    dest: tuple[Any, ...] = (None, None),
) -> tuple[np.ndarray, np.ndarray]:
    keep = rng.random(x.shape) >= drop_probability  # bool, x's shape
    out = fill(dest[0], x * keep / (1 - drop_probability))
    mask = fill(dest[1], keep)
    assert out is not None and mask is not None
    return out, mask


def _result_dtype(a: np.ndarray, drop_probability: Any) -> np.dtype:
    """The dtype of `a * keep / (1 - p)` under NumPy's promotion rules (no data touched)."""
    return (np.empty(0, a.dtype) * np.empty(0, np.bool_) / (1 - drop_probability)).dtype


def _forward_out(out: Any, x: np.ndarray, drop_probability: Any
                 ) -> tuple[np.ndarray | None, np.ndarray | None] | None:
    out = check_out_tuple(out, ("out", "keep"))
    if out is None:
        return None
    y = check_out(out[0], x.shape, _result_dtype(x, drop_probability), "out[0] (out)",
                  inputs=(("x", x, True),))
    keep = check_out(out[1], x.shape, np.dtype(np.bool_), "out[1] (keep)",
                     inputs=(("x", x, False), ("out[0] (out)", y, False)))
    return y, keep


def inverted_dropout(
    x: Any, drop_probability: float, rng: np.random.Generator, *,
    out: tuple[Any, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Zero each value with probability p and scale the survivors by 1/(1 - p).

    $$
    y = m \odot x / (1 - p),\quad m_i \sim \mathrm{Bernoulli}(1 - p)
    $$

    Parameters
    ----------
    x : numpy.ndarray
        Float array, any shape.
    drop_probability
        p in [0, 1) (a Python or NumPy real number).
    rng
        `numpy.random.Generator`; one `rng.random(x.shape)` draw is consumed.
    out
        Optional tuple `(out, keep)` of buffers (an array or None each), of x's shape, the
        result's dtype (bool for keep), C-contiguous, writeable; out may be x itself, keep
        overlaps nothing. Checked before the draw.

    Returns
    -------
    out : numpy.ndarray
        `x * keep / (1 - p)` (the listing's dtype rules).
    keep : numpy.ndarray
        Bool mask, x's shape.

    Raises
    ------
    TypeError
        Non-float x, non-number p, rng not a Generator, `out` not a tuple of 2 or a buffer of
        the wrong dtype.
    ValueError
        p outside [0, 1) or NaN; a buffer of the wrong shape or layout, read-only, or
        overlapping what it may not.

    Examples
    --------
    >>> out, keep = inverted_dropout(np.ones(4), 0.5, np.random.default_rng(0))
    >>> sorted(set(out.tolist())) in ([0.0, 2.0], [2.0], [0.0])
    True
    """
    x = as_native(as_float_array(x, "x"))
    check_probability(drop_probability, "drop_probability")
    rng = check_generator(rng)
    dest = _forward_out(out, x, drop_probability)
    extra = () if dest is None else (dest,)
    result: tuple[np.ndarray, np.ndarray] = dispatch(
        "inverted_dropout", _inverted_dropout_ref, x, drop_probability, rng, *extra
    )
    return result


def inverted_dropout_backward(
    dout: Any, keep: Any, drop_probability: float, *, out: Any = None
) -> np.ndarray:
    r"""Gradient of inverted dropout: the forward's mask and scale.

    $$
    \bar x = m \odot \bar y / (1 - p)
    $$

    Parameters
    ----------
    dout : numpy.ndarray
        Float array.
    keep : numpy.ndarray
        The bool mask from [inverted_dropout][normlab.inverted_dropout], dout's shape.
    drop_probability
        The p used in the forward, in [0, 1).
    out : numpy.ndarray, optional
        Optional buffer for dx (dout's shape, the result's dtype, C-contiguous, writeable); it
        may be dout itself, and must not overlap keep.

    Returns
    -------
    dx : numpy.ndarray
        `dout * keep / (1 - p)`.

    Raises
    ------
    TypeError
        Non-float dout, non-bool keep, non-number p, `out` of the wrong dtype.
    ValueError
        keep not of dout's shape, p outside [0, 1); `out` of the wrong shape or layout,
        read-only, or overlapping keep.

    Examples
    --------
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
    dest = check_out(out, dout.shape, _result_dtype(dout, drop_probability),
                     inputs=(("dout", dout, True), ("keep", keep, False)))
    dx = fill(dest, dout * keep / (1 - drop_probability))
    assert dx is not None
    return dx
