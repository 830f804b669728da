"""`quantize` kernel: the numba rounding kernels behind [normlab.precision.quantize][].

Dimension letters: N elements (flattened C order).

Receives the validated `(x, fmt, mode, saturate, seed, random_bits)` of the reference's
kernel seam (see `normlab.precision.formats.rounding`) and returns an array bit-identical to
`quantize_reference`, or `NotImplemented` for a format whose smallest normal lies below
the input's (float32 input to E8M0, emin = -127: float32 subnormals there round with the
reference's ml_dtypes quirk; float64 input to E8M0 is served). Formats without a zero or
without a sign (E8M0) take a second pass with their extra rules (see
[normlab.kernels.quantize_jit.fix_unsigned_or_zeroless][]). Everything a Format decides
(overflow to inf / NaN / max, what an infinite input becomes, flushing where there are no
subnormals) is turned into a handful of bit patterns here, in Python, so the compiled loops
only compare and select integers.

Fast path: round-to-nearest of float32 to a format with float32's exponent range (8
exponent bits, bias 127, IEEE inf/NaN, subnormals, signed; bf16 is the common case) is
the bit trick of [normlab.kernels.quantize_jit.round_nearest_same_range][], saturate or not.
Eligibility is read from the Format's fields, not its name.

Narrow fast path: round-to-nearest of float32 to a format with fewer exponent bits (fp8,
fp6, fp4: 1 <= m <= 22, emin >= -126) is
[normlab.kernels.quantize_jit.round_nearest_narrow][]: the same bit trick in the
target's normal range and one float32 addition below it, then the generic overflow and
special-value rules; the extra pass for formats without zero or sign still follows.

`out=` (the seam's last argument, validated by `normlab._validate.check_out`): the
loops write straight into it, no new array (the page zero-fill of a fresh result is half
the cost of a memory-bound quantize). In place (`out` is x) every loop reads element i
before writing it; only the extra pass of formats without zero or sign reads x again, so
there the result goes to a scratch array first.

Stochastic rounding draws the same words as the reference: `splitmix64(seed + i)` on the
flat C-order index i, computed per element inside the loop (no N-sized word array), or the
caller's `random_bits`. The result does not depend on the thread count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels import quantize_jit as jit
from normlab.kernels._adapt import launch
from normlab.precision.formats.format import Format, NanConvention
from normlab.precision.formats.modes import RoundingMode

__all__: list[str] = []

# float dtype -> (unsigned view, stored mantissa bits F)
_INPUT = {np.dtype(np.float32): (np.uint32, 23), np.dtype(np.float64): (np.uint64, 52)}
_MIN_EXP = {np.dtype(np.float32): -126, np.dtype(np.float64): -1022}  # input min normal
_EMPTY_WORDS = np.zeros(0, np.uint64)
_DETERMINISTIC = {  # mode -> loop of quantize_jit (looked up per call)
    RoundingMode.NEAREST: "round_nearest",
    RoundingMode.NEAREST_AWAY: "round_away",
    RoundingMode.TOWARD_ZERO: "round_zero",
}


def _bits(value: float, dtype: np.dtype, utype: Any) -> Any:
    """The bit pattern of `value` in the float `dtype` as a numpy unsigned scalar."""
    return np.array(value, dtype=dtype).view(utype)[()]


def round_params(fmt: Format, mode: RoundingMode, saturate: bool, dtype: np.dtype) -> tuple:
    """(m, emin, qbits, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out) for the kernels."""
    utype, F = _INPUT[dtype]
    m, emin = fmt.mantissa_bits, fmt.emin
    maxbits = _bits(fmt.max, dtype, utype)
    infbits = _bits(np.inf, dtype, utype)
    qnan = utype(int(infbits) | (1 << (F - 1)))  # quiet NaN, the sign is added per element
    special = infbits if fmt.has_infinity else qnan
    clamp = saturate or not fmt.has_nan
    ovf = maxbits if (clamp or mode is RoundingMode.TOWARD_ZERO) else special
    inf_out = maxbits if clamp else special
    flush = utype(0) if fmt.has_subnormals else _bits(2.0**emin, dtype, utype)
    qbits = _bits(2.0 ** (emin - m), dtype, utype)
    return m, emin, qbits, maxbits, ovf, flush, inf_out, 0, qnan


def _same_range_as_float32(fmt: Format, mode: RoundingMode, dtype: np.dtype) -> bool:
    """Whether `round_nearest_same_range` serves this call (float32 input only).

    The target must share float32's exponent field and specials exactly, and drop at
    least one mantissa bit (FLOAT32 itself takes the generic kernel, an identity).
    """
    return (
        mode is RoundingMode.NEAREST
        and dtype == np.dtype(np.float32)
        and fmt.exponent_bits == 8
        and fmt.bias == 127
        and fmt.nan is NanConvention.IEEE
        and fmt.has_infinity
        and fmt.has_subnormals
        and fmt.has_zero
        and fmt.signed
        and 1 <= fmt.mantissa_bits < _INPUT[dtype][1]
    )


def narrow_nearest_serves(fmt: Format, mode: RoundingMode, dtype: np.dtype) -> bool:
    """Whether `round_nearest_narrow` serves this call (float32 input, nearest-even).

    Any target with 1 <= m <= 22 mantissa bits and emin >= -126 (its normal range lies in
    float32's, its smallest quantum 2^(emin - m) is a float32): the fp8, fp6 and fp4
    formats. m = 0 (E8M0) is excluded: there ties go up, not to an even exponent.
    """
    return (
        mode is RoundingMode.NEAREST
        and dtype == np.dtype(np.float32)
        and 1 <= fmt.mantissa_bits < _INPUT[dtype][1]
        and fmt.emin >= _MIN_EXP[dtype]
        and fmt.emin - fmt.mantissa_bits >= _MIN_EXP[dtype] - _INPUT[dtype][1]
    )


def quantize(
    x: np.ndarray,
    fmt: Format,
    mode: RoundingMode,
    saturate: bool,
    seed: int | None,
    random_bits: np.ndarray | None,
    dest: np.ndarray | None = None,
) -> Any:
    """Kernel of `quantize_reference`: one pass, x's dtype and shape (into `dest`)."""
    if x.dtype not in _INPUT or fmt.emin < _MIN_EXP[x.dtype]:
        return NotImplemented
    utype = _INPUT[x.dtype][0]
    xb = np.ascontiguousarray(x).reshape(-1).view(utype)  # (N,)
    fix = not fmt.has_zero or not fmt.signed  # a second pass that reads x again
    if dest is None or (fix and np.shares_memory(dest, x)):
        out = np.empty_like(xb)
    else:
        out = dest.reshape(-1).view(utype)  # (N,) dest is C-contiguous: a view
    _round_into(xb, out, x, fmt, mode, saturate, seed, random_bits)
    if dest is None:
        return out.view(x.dtype).reshape(x.shape)
    if not np.shares_memory(out, dest):  # in place with a second pass: copy at the end
        np.copyto(dest.reshape(-1).view(utype), out)
    return dest


def _round_into(xb: np.ndarray, out: np.ndarray, x: np.ndarray, fmt: Format,
                mode: RoundingMode, saturate: bool, seed: int | None,
                random_bits: np.ndarray | None) -> None:
    """The rounding passes of `quantize` from the bits `xb` into `out` (N,)."""
    utype, F = _INPUT[x.dtype]
    if _same_range_as_float32(fmt, mode, x.dtype):
        # saturate: overflow and inf become max; otherwise the carry past max is inf already
        cap = _bits(fmt.max if saturate else np.inf, x.dtype, utype)
        launch(jit.round_nearest_same_range, x.size, xb, out, utype(F - fmt.mantissa_bits), cap)
        return
    args = (xb, out, *round_params(fmt, mode, saturate, x.dtype))
    n = x.size
    if narrow_nearest_serves(fmt, mode, x.dtype):
        launch(jit.round_nearest_narrow, n, *args)
    elif mode is RoundingMode.STOCHASTIC:
        if random_bits is not None:
            words = np.ascontiguousarray(random_bits).reshape(-1)
            launch(jit.round_stochastic, n, *args, words, np.uint64(0), False)
        else:
            assert seed is not None
            launch(jit.round_stochastic, n, *args, _EMPTY_WORDS, np.uint64(seed % 2**64), True)
    else:
        launch(getattr(jit, _DETERMINISTIC[mode]), n, *args)
    if not fmt.has_zero or not fmt.signed:
        minnorm = _bits(2.0**fmt.emin, x.dtype, utype)
        launch(jit.fix_unsigned_or_zeroless, n, xb, out, minnorm, args[-1], not fmt.has_zero,
               not fmt.signed)
