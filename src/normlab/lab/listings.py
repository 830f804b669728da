"""The chapter's Listing 16.4 (range, loss scaling and bfloat16 rounding), runnable.

`round_to_bfloat16` is the helper the listing calls: round to nearest, ties to even, on the
integer bits ([normlab.precision.quantize][] with [BFLOAT16][normlab.precision.BFLOAT16]),
returned as float32. The two listing functions keep the chapter's bodies; the only addition is
an `np.errstate` around the fp16 casts, whose overflow is the point of the demonstration (numpy
would otherwise warn, and warnings are errors in the tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import check_finite_real
from normlab.precision.formats.format import BFLOAT16
from normlab.precision.formats.rounding import quantize

__all__ = ["fp16_overflows_but_bfloat16_keeps_range", "loss_scaled_gradient", "round_to_bfloat16"]


def round_to_bfloat16(x: Any) -> np.ndarray:
    """Round `x` to bfloat16 (nearest, ties to even) and return the values as float32.

    Formula: keep the top 16 bits of the float32 pattern after adding
    `0x7FFF + (bit 16 of the pattern)`; float64 inputs are rounded once, directly.
    bfloat16 (Wang and Kanwar, "BFloat16: the secret to high performance on Cloud TPUs",
    2019) has float32's 8-bit exponent and 7 mantissa bits.

    Parameters
    ----------
    x : array_like
        float32 or float64 values.

    Returns
    -------
    numpy.ndarray
        float32, x's shape, every value a bfloat16 value (inf stays inf, NaN NaN).

    Raises
    ------
    TypeError
        x is not float32/float64 (integers included).

    Examples
    --------
    >>> round_to_bfloat16(np.array([1.0 + 2**-8 + 2**-9], np.float32))
    array([1.0078125], dtype=float32)
    """
    return quantize(x, BFLOAT16).astype(np.float32)  # exact: bf16 values are float32 values


def fp16_overflows_but_bfloat16_keeps_range() -> tuple[np.ndarray, np.ndarray]:
    """Listing 16.4: 1e5 and 1e30 overflow float16 (max 65504) but stay finite in bf16.

    Returns
    -------
    fp16 : numpy.ndarray
        float32 array of shape (2,): 1e5 and 1e30 stored in float16, [inf, inf].
    bf16 : numpy.ndarray
        float32 array of shape (2,): the same values in bfloat16, about [99840, 1e30].

    Examples
    --------
    >>> fp16, bf16 = fp16_overflows_but_bfloat16_keeps_range()
    >>> bool(np.isinf(fp16).all()), bool(np.isfinite(bf16).all())
    (True, True)
    """
    large = np.array([1e5, 1e30], dtype=np.float32)
    with np.errstate(over="ignore"):  # the overflow is the demonstration
        fp16 = large.astype(np.float16).astype(np.float32)
    bf16 = round_to_bfloat16(large)
    return fp16, bf16


def loss_scaled_gradient(gradient: Any, scale: Any) -> np.ndarray:
    """Listing 16.4: scale a gradient, store it in float16, unscale in float32.

    Formula: `g_true = fp16(g * S) / S` (Micikevicius et al., "Mixed Precision
    Training", ICLR 2018): a scale S moves tiny gradients out of fp16's underflow range.

    Parameters
    ----------
    gradient : array_like
        Float values, the true gradient.
    scale : float
        The loss scale S, finite and > 0.

    Returns
    -------
    numpy.ndarray
        The recovered gradient, float32 (float64 if gradient is float64: numpy's promotion
        in the listing's division).

    Raises
    ------
    TypeError, ValueError
        gradient not a float array; scale not a finite positive number.

    Examples
    --------
    >>> loss_scaled_gradient(np.array([1e-8], np.float32), 1024.0)[0] > 0
    np.True_
    """
    from normlab._validate import as_float_array

    gradient = as_float_array(gradient, "gradient")
    s = check_finite_real(scale, "scale")
    if s <= 0:
        raise ValueError(f"scale must be > 0; got {scale!r}")
    with np.errstate(over="ignore"):  # an overflow to inf is what a loss scaler checks for
        scaled = (gradient * scale).astype(np.float16)
    unscaled = scaled.astype(np.float32) / scale
    return unscaled
