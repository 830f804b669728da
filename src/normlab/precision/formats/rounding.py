"""Exact rounding of float32/float64 arrays to any `Format`, on the integer bits.

Dimension letters: N elements (the flattened C-order input).

Contract (the NumPy reference a kernel must reproduce bit for bit):
write a finite nonzero |x| = s * 2^(e - F) with s its integer significand (implicit bit
included, F = 23 or 52 stored mantissa bits) and t = floor(log2 |x|). The target's quantum
at that magnitude is 2^qe with qe = max(t, emin) - m, so d = qe - (e - F) low bits of s are
discarded: keep = s >> d, rem = s mod 2^d, and the result is n * 2^qe, n = keep + up.
Modes decide `up`: "nearest" rem > 2^(d-1), or a tie with keep odd (ties to even; with
m = 0 every normal keep is 1, so ties go up, as in ml_dtypes' E8M0); "nearest_away"
rem >= 2^(d-1); "toward_zero" never; "toward_positive" rem > 0 and x > 0;
"toward_negative" rem > 0 and x < 0 (IEEE 754-2019 roundTowardPositive / Negative, the
directed modes of gfloat's `RoundMode`); "stochastic" rem + top_d(w) >= 2^d with w the
element's 64-bit random word, i.e. `r64 + w >= 2^64` where r64 = rem << (64 - d) for
d <= 64 and rem >> (d - 64) beyond (probabilities then resolve to 2^-64). float64 inputs
are rounded once, directly.

Specials: NaN stays NaN (a quiet NaN with the input's sign), also for fp6/fp4, which have
no NaN code (ml_dtypes turns NaN into a zero there; hiding a NaN is worse). Overflow (the
rounded value above max): `saturate=True`, a format with neither inf nor NaN (fp6, fp4:
they always saturate, as ml_dtypes and OCP do), or a mode that rounds the magnitude down
("toward_zero"; "toward_positive" for x < 0; "toward_negative" for x > 0: IEEE 754-2019
sec. 7.4 carries those overflows to +-max) -> +-max; otherwise inf, or NaN where the
format has only NaN (E4M3FN: |x| > 464 -> NaN). Infinite inputs -> +-max with
`saturate=True` or for fp6/fp4, else inf, or NaN without inf (an infinity is exact, so
no rounding mode changes it). -0.0 keeps its sign, except in the fnuz formats, which have
no -0: every zero result is +0 there (their "-0" code is the NaN), as in ml_dtypes.
Unsigned formats: any negative nonzero input -> NaN. Formats without subnormals: with a
zero, results (rounded on the subnormal grid, in every mode) below min_normal flush to
+-0; without a zero (E8M0) magnitudes below min_normal become min_normal and 0 becomes
NaN, as in ml_dtypes.

E8M0 and float32 subnormals (one rule for every input dtype): the real value is rounded,
whatever its dtype, so 1.25 * 2^-127 (float32 bits 0x00500000) gives 2^-127 from float32
and from float64 alike, and 1.5 * 2^-127 (a tie; m = 0, so it goes up) gives 2^-126.
ml_dtypes < 0.7 (and torch's float8_e8m0fnu cast, 2.13) map every float32 subnormal above
2^-127 to 2^-126; normlab does not copy that: the same value must not round differently by
dtype. ml_dtypes 0.7 rounds the value, as normlab does.

Kernel seam: after validation [quantize][normlab.precision.quantize] calls
`normlab._backend.dispatch` with the name `"quantize"`, and a registered kernel gets `k(x, fmt,
mode, saturate, seed, random_bits[, out])` with x the validated float32/float64 ndarray, fmt a
Format, mode a [RoundingMode][normlab.precision.RoundingMode], saturate a bool, seed an int in
[0, 2^64) or None (words then come from
[normlab.precision.formats.random_bits.stochastic_words][normlab.precision.stochastic_words]),
random_bits a uint64 array of x's shape or None, and, only when the caller passed `out=`, out:
the validated buffer (x itself, or disjoint from x). It returns the rounded array (x's dtype and
shape; `out` when given) or NotImplemented, having written nothing. Modes in
`REFERENCE_ONLY_MODES` (the directed modes, newer than the kernel) always run the reference: the
kernel is not asked. For the fnuz formats the kernel's -0 results are turned into +0 here (the
kernel knows no fnuz convention; everything else it computes from the Format's fields matches
the reference).

Random words (`seed=` or `rng=`): element i of the flattened C-order input uses
`w_i = splitmix64((seed + i) mod 2^64)` ([normlab.precision.formats.random_bits][] gives the
formula); `rng` only draws the seed, `rng.integers(0, 2**63)`. A twin implementation
reproduces the words bit for bit from the seed alone.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from normlab import _backend
from normlab._validate import check_out
from normlab.precision.formats.format import Format, get_format
from normlab.precision.formats.modes import REFERENCE_ONLY_MODES, RoundingMode, check_mode
from normlab.precision.formats.random_bits import stochastic_source, stochastic_words

__all__ = ["RoundingMode", "quantize"]

REFERENCE_CHUNK = 1 << 16  # elements the reference rounds at once (bounds its temporaries)

# Input types: (stored mantissa bits F, exponent bias, width, unsigned view type).
_INPUT = {
    np.dtype(np.float32): (23, 127, 32, np.uint32),
    np.dtype(np.float64): (52, 1023, 64, np.uint64),
}
# Narrow inputs, as the torch twin takes them: widened to float32 (exact), rounded there,
# cast back with the input dtype's round-to-nearest-even.
_NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
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
    KIND_FINITE / KIND_INF / KIND_NAN. Zero results have n == 0. `words` (N,) uint64 is
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
    elif mode is RoundingMode.NEAREST_AWAY:
        up = r64 >= half
    elif mode is RoundingMode.TOWARD_ZERO:
        up = np.zeros(s.shape, dtype=bool)
    elif mode is RoundingMode.TOWARD_POSITIVE:
        up = (rem > 0) & ~sign  # rem, not r64: exact for any d
    elif mode is RoundingMode.TOWARD_NEGATIVE:
        up = (rem > 0) & sign
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
    return specials(np, fmt, mode, saturate, sign, n, qe, kind,
                    (s > 0) | (kind != KIND_FINITE))


def specials(
    xp: Any, fmt: Format, mode: RoundingMode, saturate: bool, sign: Any, n: Any, qe: Any,
    kind: Any, nonzero_input: Any,
) -> tuple[Any, Any, Any, Any]:
    """Apply overflow, infinity, zero and sign rules to the rounded components.

    Written once for both twins: `xp` is `numpy` (this module's arrays, `n` uint64) or
    `torch` (`normlab.torch.quantize`'s tensors, `n` int64); only `xp.where` and
    `xp.zeros_like` are called, with Python scalars for the constants, and no `if` reads
    an array value (the torch twin compiles without a graph break).
    """
    m = fmt.mantissa_bits
    top_qe = fmt.emax - m
    finite = kind == KIND_FINITE
    over = finite & ((qe > top_qe) | ((qe == top_qe) & (n > fmt.max_significand)))
    if saturate or mode is RoundingMode.TOWARD_ZERO or not fmt.has_nan:
        to_max = over
    elif mode is RoundingMode.TOWARD_POSITIVE:  # negative overflow goes to -max
        to_max = over & sign
    elif mode is RoundingMode.TOWARD_NEGATIVE:  # positive overflow goes to +max
        to_max = over & ~sign
    else:
        to_max = xp.zeros_like(over)
    if saturate or not fmt.has_nan:
        to_max = to_max | (kind == KIND_INF)
    n = xp.where(to_max, fmt.max_significand, n)
    qe = xp.where(to_max, top_qe, qe)
    special = KIND_INF if fmt.has_infinity else KIND_NAN
    kind = xp.where(over & ~to_max, special, xp.where(to_max, KIND_FINITE, kind))
    if not fmt.has_infinity:
        kind = xp.where(kind == KIND_INF, KIND_NAN, kind)
    if not fmt.has_zero:
        kind = xp.where((kind == KIND_FINITE) & (n == 0), KIND_NAN, kind)
    if not fmt.signed:
        kind = xp.where(sign & nonzero_input, KIND_NAN, kind)  # even if it rounds to zero
        sign = sign & (kind == KIND_NAN)
    n = xp.where(kind == KIND_FINITE, n, 0)
    if not fmt.has_negative_zero and fmt.signed:  # fnuz: the "-0" code is NaN; zeros are +0
        sign = sign & ~((kind == KIND_FINITE) & (n == 0))
    return sign, n, qe, kind


def assemble(
    sign: np.ndarray, n: np.ndarray, qe: np.ndarray, kind: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """Float bits of (-1)^sign * n * 2^qe in `dtype` (exact: the value is representable)."""
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


def check_input(x: Any) -> np.ndarray:
    """x as a native-order float16/bfloat16/float32/float64 ndarray, or TypeError (the check
    of `quantize`)."""
    arr: np.ndarray | None = None
    if isinstance(x, np.ndarray):
        arr = x
    elif not isinstance(x, (bool, int, np.bool_, np.integer, str, bytes)) and x is not None:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError):
            arr = None
    if arr is not None and arr.dtype.kind == "f" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))  # '>f8' is float64: never downgraded
    if arr is None or (arr.dtype not in _INPUT and arr.dtype not in _NARROW):
        shown = f"dtype {arr.dtype}" if arr is not None else f"{type(x).__name__} {x!r}"[:80]
        raise TypeError(
            f"x must be a float16, bfloat16, float32 or float64 array; got {shown}. Convert "
            "it first, e.g. np.asarray(x, dtype=np.float32)."
        )
    return arr


def quantize(
    x: Any,
    fmt: Format | str,
    *,
    rounding: RoundingMode | str = "nearest",
    saturate: bool = False,
    rng: np.random.Generator | None = None,
    seed: int | None = None,
    random_bits: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Round `x` to the values of `fmt`; the result keeps x's dtype.

    Formula: `q = (-1)^s * n * 2^qe` with `qe = max(floor(log2|x|), emin) - m` and n the
    rounded significand (see the module header for every mode and special case).
    Stochastic rounding (Croci et al., "Stochastic rounding: implementation, error analysis
    and applications", R. Soc. Open Sci. 2022) rounds up with probability equal to the
    fractional position, which makes it unbiased.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float64, any byte order (a float or a list of floats is taken as
        float64; a non-native byte order is converted, never narrowed); float16 and
        bfloat16 (ml_dtypes) as the torch twin takes them (see Notes).
    fmt : Format or str
        The target format, or its name (see [get_format][normlab.precision.get_format]).
    rounding : str or RoundingMode
        `"nearest"` (ties to even), `"stochastic"`, `"toward_zero"`, `"nearest_away"`,
        `"toward_positive"` or `"toward_negative"` (see
        [RoundingMode][normlab.precision.RoundingMode]).
    saturate : bool
        Overflow and infinities become +-max instead of inf/NaN.
    rng : numpy.random.Generator, optional
        Stochastic mode: one seed `rng.integers(0, 2**63)` is drawn, then as `seed`.
    seed : int, optional
        Stochastic mode, in [0, 2^64): element i of the flattened C-order x uses the word
        `splitmix64((seed + i) mod 2^64)` ([normlab.precision.formats.random_bits][]); the
        same seed gives the same result on every backend and thread count.
    random_bits : numpy.ndarray, optional
        Stochastic mode: explicit random words, uint64, one per element (x's shape).
        Exactly one of `rng`, `seed`, `random_bits` is required by the stochastic
        mode; the deterministic modes refuse `seed` and `random_bits` (ValueError) and
        accept an `rng` without drawing from it; more than one is an error.
    out : numpy.ndarray, optional
        Where to write the result (NumPy's convention): x's shape and (native) dtype,
        C-contiguous and writeable; `out=x` rounds in place. It must not overlap x
        partially, nor random_bits. The same bits as without `out`.

    Returns
    -------
    numpy.ndarray
        x's dtype and shape, holding values of `fmt` (or inf/NaN as below); `out` itself
        when given.


    Raises
    ------
    TypeError
        x not float16/bfloat16/float32/float64 (integers included); rng not a Generator;
        seed not an int; random_bits not uint64; out not an ndarray of x's dtype.
    ValueError
        Unknown format or mode; stochastic without randomness, or with more than one source;
        `seed` or `random_bits` with a deterministic mode; seed outside [0, 2^64);
        random_bits of another shape; out of another shape, not
        C-contiguous, read-only or overlapping x partially (or random_bits).

    Notes
    -----
    Overflow without `saturate`: inf where the format has it, else NaN (E4M3FN: above
    464); "toward_zero" and the NaN-less fp6/fp4 always clamp to +-max (as ml_dtypes/OCP),
    and so do the directed modes on the side they round towards zero. NaN stays NaN, also
    for fp6/fp4 (ml_dtypes would give a zero). float64 is rounded once. float16 and
    bfloat16 inputs are rounded in float32 (an exact widening) and cast back to their
    dtype with round-to-nearest-even, as [normlab.torch.quantize][] does, bit for bit
    (NaN payloads aside): the cast is exact whenever the format's values are values of
    the input dtype (a format no wider than it), otherwise it is a second rounding.

    Examples
    --------
    >>> quantize(np.array([1.0 + 2**-8], np.float32), "bf16")
    array([1.], dtype=float32)
    >>> quantize(np.array([1.01, -1.01]), "e4m3", rounding="toward_positive").tolist()
    [1.125, -1.0]
    >>> quantize(np.array([1.0625] * 4), "e4m3", rounding="stochastic", seed=0).tolist()
    [1.125, 1.125, 1.125, 1.0]
    """
    arr = check_input(x)
    fmt = get_format(fmt)
    mode = check_mode(rounding)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool; got {saturate!r}")
    seed_, words = stochastic_source(mode is RoundingMode.STOCHASTIC, rng, seed, random_bits,
                                     arr.shape)
    dest = check_out(out, arr.shape, arr.dtype, inputs=(("x", arr, True),
                                                         ("random_bits", words, False)))
    if arr.dtype in _NARROW:  # as the torch twin: round in float32, cast back (RNE)
        wide = quantize(arr.astype(np.float32), fmt, rounding=mode, saturate=bool(saturate),
                        seed=seed_, random_bits=words)
        with np.errstate(over="ignore"):  # a format wider than x's dtype: inf, as in torch
            narrow = wide.astype(arr.dtype)
        if dest is None:
            return narrow
        dest[...] = narrow
        return dest
    if mode in REFERENCE_ONLY_MODES:  # the kernel predates these modes: do not ask it
        return quantize_reference(arr, fmt, mode, bool(saturate), seed_, words, dest)
    args = (arr, fmt, mode, bool(saturate), seed_, words) + (() if dest is None else (dest,))
    result: np.ndarray = _backend.dispatch("quantize", quantize_reference, *args)
    if not fmt.has_negative_zero and fmt.signed:
        result[result == 0] = 0  # fnuz: no -0 (the kernel knows no fnuz convention)
    return result


def quantize_reference(
    x: np.ndarray, fmt: Format, mode: RoundingMode, saturate: bool, seed: int | None,
    words: np.ndarray | None, out: np.ndarray | None = None,
) -> np.ndarray:
    """The NumPy reference behind `quantize` (validated arguments, no dispatch).

    `out` (validated: x's shape and dtype, C-contiguous, x itself or disjoint from it)
    receives the result, chunk by chunk; each chunk of x is read before it is written.

    Rounds `REFERENCE_CHUNK` elements at a time (flattened C order) into the result, so
    the integer temporaries (about 40 bytes per float32 element) cost a fixed few MiB,
    not 40x the input: peak extra memory is the result plus ~40 x min(N, REFERENCE_CHUNK)
    x itemsize. Element i still uses the word `splitmix64(seed + i)` (the chunk starting
    at i0 draws `stochastic_words(seed + i0, ...)`), so chunking changes no bit.
    """
    flat = np.ascontiguousarray(x).reshape(-1)  # (N,)
    dest = np.empty(x.shape, x.dtype) if out is None else out
    flat_out = dest.reshape(-1)  # (N,) a view: dest is C-contiguous
    flat_words = None if words is None else np.ascontiguousarray(words).reshape(-1)
    for i0 in range(0, flat.size, REFERENCE_CHUNK):
        part = flat[i0 : i0 + REFERENCE_CHUNK]  # (C,)
        w = None if flat_words is None else flat_words[i0 : i0 + REFERENCE_CHUNK]
        if mode is RoundingMode.STOCHASTIC and w is None:
            assert seed is not None
            w = stochastic_words((seed + i0) % 2**64, part.shape)
        flat_out[i0 : i0 + REFERENCE_CHUNK] = assemble(
            *round_components(part, fmt, mode, saturate, w), x.dtype)
    return dest
