"""Scalar reference of :func:`normlab.precision.quantize`, in exact rational arithmetic.

Contract: ``round_scalar(x, fmt, mode, saturate, word)`` returns, as a Python float, what
``quantize`` returns for one element. It shares no code with the vectorised path: it works
with :class:`fractions.Fraction` values and the format's definition (the two neighbours
``lo`` and ``lo + q`` of |x| on the grid of quantum q), not with bit fields, so the tests
can hold each against the other. It is slow (microseconds per element): use it for tests
and teaching, never on large arrays.

Stochastic rule in these terms: with t = (|x| - lo) / q in [0, 1), round up iff
floor(t * 2^64) + word >= 2^64, i.e. with probability floor(t * 2^64) / 2^64 (= t whenever
t has at most 64 fractional bits).
"""

from __future__ import annotations

import math
from fractions import Fraction

from normlab.precision.formats import Format
from normlab.precision.rounding import RoundingMode

__all__ = ["round_scalar"]

_TWO64 = 2**64


def _grid(v: Fraction, fmt: Format) -> tuple[Fraction, int]:
    """Quantum q at magnitude v > 0 and floor(v / q)."""
    _, exp = math.frexp(float(v))  # exact: v is a float, v = mant * 2^exp, mant in [0.5, 1)
    t = exp - 1  # floor(log2 v)
    q = Fraction(2) ** (max(t, fmt.emin) - fmt.mantissa_bits)
    return q, math.floor(v / q)


def round_scalar(
    x: float,
    fmt: Format,
    mode: RoundingMode | str = RoundingMode.NEAREST,
    saturate: bool = False,
    word: int | None = None,
    *,
    from_float32: bool = True,
) -> float:
    """Round one value ``x`` to ``fmt`` exactly; see the module header for the rules.

    Parameters
    ----------
    x : float
        The input value (a float32 value when ``from_float32``).
    fmt : Format
    mode : RoundingMode or its string
    saturate : bool
    word : int in [0, 2^64), required for the stochastic mode
    from_float32 : bool
        Whether x came from a float32 array (only matters for ml_dtypes' E8M0 quirk on
        float32 subnormals, reproduced under "nearest").

    Returns
    -------
    float: the rounded value (inf or NaN on overflow/specials as quantize).

    Example
    -------
    >>> from normlab.precision.formats import BFLOAT16
    >>> round_scalar(1.0 + 2.0**-8, BFLOAT16)
    1.0
    """
    mode = RoundingMode(mode)
    nan = math.nan
    if math.isnan(x):
        return nan
    negative = math.copysign(1.0, x) < 0
    if negative and not fmt.signed and x != 0:
        return nan
    sgn = -1.0 if negative and fmt.signed else 1.0
    fmax = Fraction(fmt.max)
    if math.isinf(x):
        if saturate or not fmt.has_nan:
            return sgn * fmt.max
        return sgn * math.inf if fmt.has_infinity else nan
    v = abs(Fraction(x))
    if v == 0:
        return nan if not fmt.has_zero else sgn * 0.0
    if not fmt.has_zero and v < Fraction(fmt.min_normal):
        return sgn * fmt.min_normal
    q, lo = _grid(v, fmt)
    frac = v / q - lo  # in [0, 1)
    if mode is RoundingMode.NEAREST:
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and lo % 2 == 1)
        quirk = from_float32 and not fmt.has_zero and fmt.emin == -127
        if quirk and Fraction(2) ** -127 < v < Fraction(2) ** -126:
            up = True  # ml_dtypes maps float32 subnormals above 2^-127 up to 2^-126
    elif mode is RoundingMode.NEAREST_AWAY:
        up = frac >= Fraction(1, 2)
    elif mode is RoundingMode.TOWARD_ZERO:
        up = False
    else:
        if word is None:
            raise ValueError("stochastic rounding needs a 64-bit random word")
        up = math.floor(frac * _TWO64) + word >= _TWO64
    r = (lo + int(up)) * q
    if not fmt.has_subnormals and fmt.has_zero and r < Fraction(fmt.min_normal):
        r = Fraction(0)  # flush-to-zero format
    if r > fmax:
        if saturate or mode is RoundingMode.TOWARD_ZERO or not fmt.has_nan:
            return sgn * fmt.max
        return sgn * math.inf if fmt.has_infinity else nan
    return sgn * float(r)
