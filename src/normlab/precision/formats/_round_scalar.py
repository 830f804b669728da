"""Scalar reference of [normlab.precision.quantize][], in exact rational arithmetic.

Contract: `round_scalar(x, fmt, mode, saturate, word)` returns, as a Python float, what
`quantize` returns for one element. It shares no code with the vectorised path: it works
with `fractions.Fraction` values and the format's definition (the two neighbours
`lo` and `lo + q` of |x| on the grid of quantum q), not with bit fields, so the tests
can hold each against the other. It is slow (microseconds per element): use it for tests
and teaching, never on large arrays.

Directed modes: "toward_positive" takes `lo + q` for x > 0 when |x| is off the grid and
`lo` for x < 0; "toward_negative" the mirror image; overflow on the side rounded towards
zero gives +-max (IEEE 754-2019 sec. 7.4). fnuz formats: a zero result is +0.

Stochastic rule in these terms: with t = (|x| - lo) / q in [0, 1), round up iff
floor(t * 2^64) + word >= 2^64, i.e. with probability floor(t * 2^64) / 2^64 (= t whenever
t has at most 64 fractional bits).
"""

from __future__ import annotations

import math
from fractions import Fraction

from normlab.precision.formats.format import Format
from normlab.precision.formats.modes import RoundingMode

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
) -> float:
    """Round one value `x` to `fmt` exactly; see the module header for the rules.

    Parameters
    ----------
    x : float
        The input value (a float32 value when `from_float32`).
    fmt : Format
        The target format.
    mode : RoundingMode or str
        The rounding mode.
    saturate : bool
        Overflow and infinities become +-max instead of inf/NaN.
    word : int, optional
        The element's 64-bit random word, in [0, 2^64): required for the stochastic mode.

    Returns
    -------
    float
        The rounded value (inf or NaN on overflow and specials, as `quantize`).


    Examples
    --------
    >>> from normlab.precision.formats.format import BFLOAT16
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
    zero = 0.0 if not fmt.has_negative_zero else sgn * 0.0
    fmax = Fraction(fmt.max)
    if math.isinf(x):
        if saturate or not fmt.has_nan:
            return sgn * fmt.max
        return sgn * math.inf if fmt.has_infinity else nan
    v = abs(Fraction(x))
    if v == 0:
        return nan if not fmt.has_zero else zero
    if not fmt.has_zero and v < Fraction(fmt.min_normal):
        return sgn * fmt.min_normal
    q, lo = _grid(v, fmt)
    frac = v / q - lo  # in [0, 1)
    if mode is RoundingMode.NEAREST:
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and lo % 2 == 1)
    elif mode is RoundingMode.NEAREST_AWAY:
        up = frac >= Fraction(1, 2)
    elif mode is RoundingMode.TOWARD_ZERO:
        up = False
    elif mode is RoundingMode.TOWARD_POSITIVE:
        up = frac > 0 and not negative
    elif mode is RoundingMode.TOWARD_NEGATIVE:
        up = frac > 0 and negative
    else:
        if word is None:
            raise ValueError("stochastic rounding needs a 64-bit random word")
        up = math.floor(frac * _TWO64) + word >= _TWO64
    r = (lo + int(up)) * q
    if not fmt.has_subnormals and fmt.has_zero and r < Fraction(fmt.min_normal):
        r = Fraction(0)  # flush-to-zero format
    if r > fmax:
        inward = mode is RoundingMode.TOWARD_ZERO or (
            mode is RoundingMode.TOWARD_POSITIVE and negative
        ) or (mode is RoundingMode.TOWARD_NEGATIVE and not negative)
        if saturate or inward or not fmt.has_nan:
            return sgn * fmt.max
        return sgn * math.inf if fmt.has_infinity else nan
    return zero if r == 0 else sgn * float(r)
