"""Exact rounding of float32/float64 arrays to any :class:`Format`, on the integer bits.

Dimension letters: N elements (the flattened C-order input).

Contract (the NumPy reference a kernel must reproduce bit for bit):
write a finite nonzero |x| = s * 2^(e - F) with s its integer significand (implicit bit
included, F = 23 or 52 stored mantissa bits) and t = floor(log2 |x|). The target's quantum
at that magnitude is 2^qe with qe = max(t, emin) - m, so d = qe - (e - F) low bits of s are
discarded: keep = s >> d, rem = s mod 2^d, and the result is n * 2^qe, n = keep + up.
Modes decide ``up``: "nearest" rem > 2^(d-1), or a tie with keep odd (ties to even; with
m = 0 every normal keep is 1, so ties go up, as in ml_dtypes' E8M0); "nearest_away"
rem >= 2^(d-1); "toward_zero" never; "stochastic" rem + top_d(w) >= 2^d with w the
element's 64-bit random word, i.e. ``r64 + w >= 2^64`` where r64 = rem << (64 - d) for
d <= 64 and rem >> (d - 64) beyond (probabilities then resolve to 2^-64). float64 inputs
are rounded once, directly.

Specials: NaN stays NaN (a quiet NaN with the input's sign), also for fp6/fp4, which have
no NaN code (ml_dtypes turns NaN into a zero there; hiding a NaN is worse). Overflow (the
rounded value above max): ``saturate=True`` or "toward_zero" or a format with neither inf
nor NaN (fp6, fp4: they always saturate, as ml_dtypes and OCP do) -> +-max; otherwise inf,
or NaN where the format has only NaN (E4M3FN: |x| > 464 -> NaN). Infinite inputs -> +-max
with ``saturate=True`` or for fp6/fp4, else inf, or NaN without inf. -0.0 keeps its sign.
Unsigned formats: any negative nonzero input -> NaN. Formats without subnormals: with a
zero, results below min_normal flush to +-0; without a zero (E8M0) magnitudes below
min_normal become min_normal and 0 becomes NaN, as in ml_dtypes. One ml_dtypes quirk is
reproduced under "nearest" for float32 inputs: E8M0 maps float32 subnormals in
(2^-127, 2^-126) to 2^-126.

Kernel seam: after validation :func:`quantize` calls ``normlab._backend.kernel("quantize")``
and, if one is registered, ``k(x, fmt, mode, saturate, seed, random_bits)`` with x the
validated float32/float64 ndarray, fmt a Format, mode a :class:`RoundingMode`, saturate a
bool, seed an int in [0, 2^63) or None (words then come from
:func:`normlab.precision.random_bits.stochastic_words`), random_bits a uint64 array of x's
shape or None. It returns the rounded array (x's dtype and shape) or NotImplemented.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from normlab import _backend
from normlab._validate import check_generator
from normlab.precision.formats import Format, get_format
from normlab.precision.random_bits import stochastic_words

__all__ = ["RoundingMode", "quantize"]


class RoundingMode(enum.Enum):
    """Rounding modes of :func:`quantize` (the strings are accepted too)."""

    NEAREST = "nearest"  # to nearest, ties to even
    STOCHASTIC = "stochastic"  # up with probability equal to the fractional position
    TOWARD_ZERO = "toward_zero"  # truncate the magnitude
    NEAREST_AWAY = "nearest_away"  # to nearest, ties away from zero


# Input types: (stored mantissa bits F, exponent bias, width, unsigned view type).
_INPUT = {
    np.dtype(np.float32): (23, 127, 32, np.uint32),
    np.dtype(np.float64): (52, 1023, 64, np.uint64),
}
_U1 = np.uint64(1)
KIND_FINITE, KIND_INF, KIND_NAN = 0, 1, 2


def _u(v: Any) -> np.ndarray:
    return np.asarray(v).astype(np.uint64)


def _shl(a: np.ndarray, k: np.ndarray) -> np.ndarray:
    """a << k for uint64 arrays, 0 where k >= 64 (numpy would wrap the shift count)."""
    return np.where(k >= 64, np.uint64(0), a << _u(np.minimum(k, 63)))


def _shr(a: np.ndarray, k: np.ndarray) -> np.ndarray:
    """a >> k for uint64 arrays, 0 where k >= 64."""
    return np.where(k >= 64, np.uint64(0), a >> _u(np.minimum(k, 63)))


def bit_length(u: np.ndarray) -> np.ndarray:
    """Number of significant bits of each uint64 (0 for 0), by binary search: int64."""
    n = np.zeros(u.shape, dtype=np.int64)
    v = u.copy()
    for step in (32, 16, 8, 4, 2, 1):
        big = v >= (_U1 << np.uint64(step))
        v = np.where(big, v >> np.uint64(step), v)
        n += big * step
    return n + (v > 0)


def round_components(
    x: np.ndarray, fmt: Format, mode: RoundingMode, saturate: bool, words: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Round every element; return (sign, n, qe, kind), each (N,), value = (-1)^sign n 2^qe.

    sign is bool, n uint64 (n < 2^(m+1): a carry is renormalised into qe), qe int64, kind
    KIND_FINITE / KIND_INF / KIND_NAN. Zero results have n == 0. ``words`` (N,) uint64 is
    required for the stochastic mode.
    """
    F, B, W, utype = _INPUT[x.dtype]
    m = fmt.mantissa_bits
    bits = np.ascontiguousarray(x).reshape(-1).view(utype).astype(np.uint64)  # (N,)
    sign = (bits >> np.uint64(W - 1)).astype(bool)
    a = bits & ((_U1 << np.uint64(W - 1)) - _U1)
    E = (a >> np.uint64(F)).astype(np.int64)
    frac = a & ((_U1 << np.uint64(F)) - _U1)
    top = 2 ** (W - F - 1) - 1
    kind = np.where(E == top, np.where(frac == 0, KIND_INF, KIND_NAN), KIND_FINITE)
    s = np.where(E > 0, frac | (_U1 << np.uint64(F)), frac)  # (N,) significand
    e = np.maximum(E, 1) - B
    t = bit_length(s) - 1 + e - F  # floor(log2|x|) where s > 0
    qe = np.maximum(t, fmt.emin) - m
    d = np.where(s > 0, qe - (e - F), 0)  # >= 0: the format lies within the input's range
    keep = _shr(s, d)
    rem = s - _shl(keep, d)
    # rem / 2^d as a 0.64 fixed-point fraction (exact for d <= 64, truncated beyond)
    r64 = np.where(d <= 64, _shl(rem, np.maximum(64 - d, 0)), _shr(rem, np.maximum(d - 64, 0)))
    half = np.uint64(1 << 63)
    if mode is RoundingMode.NEAREST:
        up = (r64 > half) | ((r64 == half) & ((keep & _U1) == _U1))
        if not fmt.has_zero and fmt.emin == -127 and F == 23:  # ml_dtypes' E8M0 quirk
            up |= (E == 0) & (s > (_U1 << np.uint64(22)))
    elif mode is RoundingMode.NEAREST_AWAY:
        up = r64 >= half
    elif mode is RoundingMode.TOWARD_ZERO:
        up = np.zeros(s.shape, dtype=bool)
    else:
        assert words is not None
        up = r64 > ~words.reshape(-1)  # r64 + w >= 2^64
    n = keep + up.astype(np.uint64)
    carry = n >> np.uint64(m + 1) != 0
    n = np.where(carry, n >> _U1, n)
    qe = np.where(carry, qe + 1, qe)
    if not fmt.has_zero:  # no zero, no subnormals: below min_normal -> min_normal
        low = (s > 0) & (t < fmt.emin)
        n = np.where(low, _U1 << np.uint64(m), n)
        qe = np.where(low, fmt.emin - m, qe)
    elif not fmt.has_subnormals:  # flush-to-zero format: subnormal results become 0
        n = np.where(n < (_U1 << np.uint64(m)), np.uint64(0), n)
    return _specials(fmt, mode, saturate, sign, n, qe, kind, (s > 0) | (kind != KIND_FINITE))


def _specials(
    fmt: Format, mode: RoundingMode, saturate: bool, sign: np.ndarray, n: np.ndarray,
    qe: np.ndarray, kind: np.ndarray, nonzero_input: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Apply overflow, infinity, zero and sign rules to the rounded components."""
    m = fmt.mantissa_bits
    top_qe = fmt.emax - m
    finite = kind == KIND_FINITE
    over = finite & ((qe > top_qe) | ((qe == top_qe) & (n > np.uint64(fmt.max_significand))))
    clamp_over = saturate or mode is RoundingMode.TOWARD_ZERO or not fmt.has_nan
    clamp_inf = saturate or not fmt.has_nan
    to_max = over & clamp_over | (kind == KIND_INF) & clamp_inf
    n = np.where(to_max, np.uint64(fmt.max_significand), n)
    qe = np.where(to_max, top_qe, qe)
    special = KIND_INF if fmt.has_infinity else KIND_NAN
    kind = np.where(over & ~to_max, special, np.where(to_max, KIND_FINITE, kind))
    kind = np.where((kind == KIND_INF) & ~fmt.has_infinity, KIND_NAN, kind)
    if not fmt.has_zero:
        kind = np.where((kind == KIND_FINITE) & (n == 0), KIND_NAN, kind)
    if not fmt.signed:
        negative = sign & nonzero_input  # even when it would round to zero
        kind = np.where(negative, KIND_NAN, kind)
        sign = sign & (kind == KIND_NAN)
    n = np.where(kind == KIND_FINITE, n, np.uint64(0))
    return sign, n, qe, kind


def assemble(
    sign: np.ndarray, n: np.ndarray, qe: np.ndarray, kind: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """Float bits of (-1)^sign * n * 2^qe in ``dtype`` (exact: the value is representable)."""
    F, B, W, utype = _INPUT[np.dtype(dtype)]
    L = bit_length(n)  # (N,)
    el = qe + L - 1  # exponent of the leading bit
    normal = el >= 1 - B
    frac_n = _shl(n, np.maximum(F - (L - 1), 0)) & ((_U1 << np.uint64(F)) - _U1)
    bits_n = (_u(np.maximum(el + B, 0)) << np.uint64(F)) | frac_n
    bits_s = _shl(n, np.maximum(qe - (1 - B - F), 0))
    mag = np.where(normal, bits_n, bits_s)
    mag = np.where(n == 0, np.uint64(0), mag)
    inf = _u(2 ** (W - F - 1) - 1) << np.uint64(F)
    mag = np.where(kind == KIND_INF, inf, mag)
    mag = np.where(kind == KIND_NAN, inf | (_U1 << np.uint64(F - 1)), mag)
    out = mag | (sign.astype(np.uint64) << np.uint64(W - 1))
    return out.astype(utype).view(dtype)


def _check_mode(rounding: Any) -> RoundingMode:
    try:
        return RoundingMode(rounding)
    except ValueError:
        raise ValueError(
            f"rounding must be one of {[r.value for r in RoundingMode]}; got {rounding!r}"
        ) from None


def _check_input(x: Any) -> np.ndarray:
    arr: np.ndarray | None = None
    if isinstance(x, np.ndarray):
        arr = x
    elif not isinstance(x, (bool, int, np.bool_, np.integer, str, bytes)) and x is not None:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError):
            arr = None
    if arr is None or arr.dtype not in _INPUT:
        shown = f"dtype {arr.dtype}" if arr is not None else f"{type(x).__name__} {x!r}"[:80]
        raise TypeError(
            f"x must be a float32 or float64 array; got {shown}. Convert it first, e.g. "
            "np.asarray(x, dtype=np.float32)."
        )
    return arr


def quantize(
    x: Any,
    fmt: Format | str,
    *,
    rounding: RoundingMode | str = "nearest",
    saturate: bool = False,
    rng: np.random.Generator | None = None,
    random_bits: np.ndarray | None = None,
) -> np.ndarray:
    """Round ``x`` to the values of ``fmt``; the result keeps x's dtype (float32/float64).

    Formula: ``q = (-1)^s * n * 2^qe`` with ``qe = max(floor(log2|x|), emin) - m`` and n the
    rounded significand (see the module header for every mode and special case).
    Stochastic rounding (Croci et al., "Stochastic rounding: implementation, error analysis
    and applications", R. Soc. Open Sci. 2022) rounds up with probability equal to the
    fractional position, which makes it unbiased.

    Parameters
    ----------
    x : ndarray of float32 or float64 (a float or a list of floats is taken as float64)
    fmt : Format or str (see :func:`get_format`)
    rounding : "nearest" | "stochastic" | "toward_zero" | "nearest_away" or RoundingMode
    saturate : bool
        Overflow and infinities become +-max instead of inf/NaN.
    rng : numpy.random.Generator, optional
        Stochastic mode: one seed ``rng.integers(0, 2**63)`` is drawn, element i uses the
        word ``splitmix64(seed + i)`` (:mod:`normlab.precision.random_bits`).
    random_bits : ndarray of uint64 with x's shape, optional
        Stochastic mode: explicit random words instead of ``rng`` (pass one of the two).
        Both are ignored by the deterministic modes.

    Returns
    -------
    ndarray of x's dtype and shape holding values of ``fmt`` (or inf/NaN as above).

    Raises
    ------
    TypeError
        x not float32/float64 (integers included); rng not a Generator; random_bits not uint64.
    ValueError
        Unknown format or mode; stochastic without randomness, or with both; bad shape.

    Notes
    -----
    Overflow without ``saturate``: inf where the format has it, else NaN (E4M3FN: above
    464); "toward_zero" and the NaN-less fp6/fp4 always clamp to +-max (as ml_dtypes/OCP).
    NaN stays NaN, also for fp6/fp4 (ml_dtypes would give a zero). float64 is rounded once.

    Example
    -------
    >>> quantize(np.array([1.0 + 2**-8], np.float32), "bf16")
    array([1.], dtype=float32)
    """
    arr = _check_input(x)
    fmt = get_format(fmt)
    mode = _check_mode(rounding)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool; got {saturate!r}")
    seed: int | None = None
    words: np.ndarray | None = None
    if mode is RoundingMode.STOCHASTIC:
        if (rng is None) == (random_bits is None):
            raise ValueError(
                "stochastic rounding needs exactly one source of randomness: rng= (a "
                "numpy.random.Generator) or random_bits= (uint64 words of x's shape); got "
                f"rng={'set' if rng is not None else None}, "
                f"random_bits={'set' if random_bits is not None else None}"
            )
        if random_bits is not None:
            words = _check_words(random_bits, arr.shape)
        else:
            seed = int(check_generator(rng).integers(0, 2**63, dtype=np.int64))
    out: np.ndarray = _backend.dispatch(
        "quantize", quantize_reference, arr, fmt, mode, bool(saturate), seed, words
    )
    return out


def _check_words(random_bits: Any, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint64:
        raise TypeError(
            "random_bits must be a numpy array of dtype uint64; got "
            f"{getattr(random_bits, 'dtype', type(random_bits).__name__)}"
        )
    if random_bits.shape != shape:
        raise ValueError(
            f"random_bits must have x's shape {shape}; got shape {random_bits.shape}"
        )
    return random_bits


def quantize_reference(
    x: np.ndarray, fmt: Format, mode: RoundingMode, saturate: bool, seed: int | None,
    words: np.ndarray | None,
) -> np.ndarray:
    """The NumPy reference behind :func:`quantize` (validated arguments, no dispatch)."""
    if mode is RoundingMode.STOCHASTIC and words is None:
        assert seed is not None
        words = stochastic_words(seed, x.shape)
    parts = round_components(x, fmt, mode, saturate, words)
    return assemble(*parts, x.dtype).reshape(x.shape)
