"""Bit codes of a `Format`: encode, decode, ml_dtypes storage and a bit-layout view.

Contract: a code is the unsigned integer `sign << (e + m) | exponent << m | mantissa` (no sign
field in unsigned formats), stored in uint8 / uint16 / uint32 by the format's width.
[encode][normlab.precision.encode] takes values that the format represents exactly (round them
first with [quantize][normlab.precision.quantize]); it never rounds, so `decode(encode(x)) == x`
bit for bit. NaN encodes to the format's canonical NaN (IEEE: all-ones exponent, top mantissa
bit set; "fn": all-ones magnitude; "fnuz": the sign bit alone, 0x80), which is what ml_dtypes
produces. The fnuz formats have no -0: -0.0 encodes to the code of +0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from normlab.precision.formats.format import Format, NanConvention, get_format
from normlab.precision.formats.rounding import (
    KIND_FINITE,
    KIND_INF,
    KIND_NAN,
    RoundingMode,
    assemble,
    check_input,
    quantize,
    round_components,
)

__all__ = ["BitLayout", "bit_layout", "decode", "encode", "from_ml_dtypes", "to_ml_dtypes"]

_STORAGE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float6_e3m2fn": np.dtype(ml_dtypes.float6_e3m2fn),
    "float6_e2m3fn": np.dtype(ml_dtypes.float6_e2m3fn),
    "float4_e2m1fn": np.dtype(ml_dtypes.float4_e2m1fn),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8_e4m3b11fnuz": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
}


def code_dtype(fmt: Format) -> np.dtype:
    """The unsigned integer type that holds one code of `fmt` (uint8/uint16/uint32)."""
    return np.dtype(np.uint8 if fmt.bits <= 8 else np.uint16 if fmt.bits <= 16 else np.uint32)


def encode(x: Any, fmt: Format | str) -> np.ndarray:
    """The codes of the values in `x` (float32/float64, exactly representable in `fmt`).

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float64 values that `fmt` holds exactly.
    fmt : Format or str
        The format, or its name.

    Returns
    -------
    numpy.ndarray
        uint8, uint16 or uint32 codes (by `fmt.bits`), x's shape.

    Raises
    ------
    TypeError
        x is not float32/float64.
    ValueError
        A value `fmt` cannot hold exactly (round first with `quantize(x, fmt)`), an infinity in
        a format without one, NaN in a format without NaN.

    Examples
    --------
    >>> encode(np.array([1.0, -2.0], np.float32), "e4m3").tolist()
    [56, 192]
    """
    arr = check_input(x)
    fmt = get_format(fmt)
    sign, n, qe, kind = round_components(arr, fmt, RoundingMode.TOWARD_ZERO, False, None)
    back = assemble(sign, n, qe, kind, arr.dtype)
    utype = back.dtype.str.replace("f", "u")
    flat = arr.reshape(-1)
    same = (back.view(utype) == flat.view(utype)) | (np.isnan(back) & np.isnan(flat))
    if not fmt.has_negative_zero:
        same |= (back == 0) & (flat == 0)  # fnuz: -0.0 is the value 0, stored as +0
    if not same.all():
        bad = flat[~same][0]
        raise ValueError(
            f"x holds {int((~same).sum())} value(s) that {fmt.name} cannot represent exactly "
            f"(first: {bad!r}); round first with quantize(x, {fmt.name!r})"
        )
    if not fmt.has_nan and (kind == KIND_NAN).any():
        raise ValueError(f"{fmt.name} cannot represent NaN: it has no NaN code")
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    one = np.uint64(1)
    normal = n >= (one << np.uint64(m))
    expo = np.where(normal, qe + m + fmt.bias, 0).astype(np.uint64)
    mant = np.where(normal, n - (one << np.uint64(m)), n)
    all_e = np.uint64(2**e - 1)
    if fmt.nan is NanConvention.IEEE:
        expo = np.where(kind != KIND_FINITE, all_e, expo)
        quiet = np.uint64(1 << (m - 1))
        mant = np.where(kind == KIND_INF, 0, np.where(kind == KIND_NAN, quiet, mant))
    elif fmt.nan is NanConvention.FN:
        expo = np.where(kind == KIND_NAN, all_e, expo)
        mant = np.where(kind == KIND_NAN, np.uint64(2**m - 1), mant)
    codes = (expo << np.uint64(m)) | mant.astype(np.uint64)
    if fmt.nan is NanConvention.FNUZ:  # NaN is the "-0" code; zeros are +0
        codes = np.where(kind == KIND_NAN, np.uint64(0), codes)
        sign = (kind == KIND_NAN) | (sign & (codes != 0))
    if fmt.signed:
        codes |= sign.astype(np.uint64) << np.uint64(e + m)
    return codes.astype(code_dtype(fmt)).reshape(arr.shape)


def decode(codes: Any, fmt: Format | str) -> np.ndarray:
    """The float32 values of integer `codes` of `fmt` (every code decodes exactly).

    Formula: normal `(-1)^s 2^(E - bias) (1 + M / 2^m)`, subnormal
    `(-1)^s 2^(1 - bias) M / 2^m`, plus the format's inf/NaN codes (IEEE 754-2019 §3.4).

    Parameters
    ----------
    codes : array_like
        Integer codes, any shape.
    fmt : Format or str
        The format, or its name.

    Returns
    -------
    numpy.ndarray
        float32, codes' shape (NaN codes decode to a quiet NaN with their sign).

    Raises
    ------
    TypeError
        codes is not an integer array (or list of ints).
    ValueError
        A code outside [0, 2^bits).

    Examples
    --------
    >>> decode(np.array([56, 192], np.uint8), "e4m3").tolist()
    [1.0, -2.0]
    """
    fmt = get_format(fmt)
    arr = np.asarray(codes)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"codes must be an array of unsigned integers; got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 2**fmt.bits):
        raise ValueError(
            f"codes of {fmt.name} must lie in [0, {2**fmt.bits}); got values in "
            f"[{int(arr.min())}, {int(arr.max())}]"
        )
    c = arr.reshape(-1).astype(np.uint64)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    mant = c & np.uint64(2**m - 1)
    expo = (c >> np.uint64(m)) & np.uint64(2**e - 1)
    sign = fmt.signed & ((c >> np.uint64(e + m)) & np.uint64(1)).astype(bool)
    top = expo == 2**e - 1
    kind = np.full(c.shape, KIND_FINITE)
    if fmt.nan is NanConvention.IEEE:
        kind = np.where(top, np.where(mant == 0, KIND_INF, KIND_NAN), kind)
    elif fmt.nan is NanConvention.FN:
        kind = np.where(top & (mant == 2**m - 1), KIND_NAN, kind)
    elif fmt.nan is NanConvention.FNUZ:
        kind = np.where(c == np.uint64(1 << (e + m)), KIND_NAN, kind)
    field0 = (expo == 0) & fmt.has_zero  # subnormal (or zero-only) field
    n = np.where(field0, mant if fmt.has_subnormals else 0, mant | np.uint64(1 << m))
    qe = np.where(field0, fmt.emin, expo.astype(np.int64) - fmt.bias) - m
    n = np.where(kind == KIND_FINITE, n, np.uint64(0))
    return assemble(sign, n, qe, kind, np.dtype(np.float32)).reshape(arr.shape)


def to_ml_dtypes(x: Any, fmt: Format | str, **quantize_options: Any) -> np.ndarray:
    """Round `x` with `quantize` and store it in the matching numpy/ml_dtypes type.

    Parameters
    ----------
    x : numpy.ndarray
        float32 or float64 values.
    fmt : Format or str
        A named format (float32, float16, bfloat16, fp8, fp6, fp4, E8M0), or its name.
    **quantize_options
        `rounding`, `saturate`, `rng`, `seed`, `random_bits`: passed to
        [quantize][normlab.precision.quantize].

    Returns
    -------
    numpy.ndarray
        x's shape, in the format's numpy/ml_dtypes type (1 byte per fp8/fp6/fp4 element, 2
        for bfloat16/float16).

    Raises
    ------
    ValueError
        A format without a storage type (user formats); NaN into fp6/fp4 (no NaN code).

    Examples
    --------
    >>> to_ml_dtypes(np.array([0.1], np.float32), "bf16").dtype.name
    'bfloat16'
    """
    fmt = get_format(fmt)
    storage = _storage_of(fmt)
    codes = encode(quantize(x, fmt, **quantize_options), fmt)
    return codes.view(storage)


def from_ml_dtypes(a: Any) -> np.ndarray:
    """The float32 values of an array of a numpy/ml_dtypes float type of a named format.

    Decoded from the stored codes with [decode][normlab.precision.decode] (exact), not with
    ml_dtypes' cast.

    Parameters
    ----------
    a : numpy.ndarray
        An array of float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float6_e3m2fn,
        float6_e2m3fn, float4_e2m1fn, float8_e8m0fnu, float8_e4m3fnuz, float8_e5m2fnuz or
        float8_e4m3b11fnuz.

    Returns
    -------
    numpy.ndarray
        float32, a's shape.

    Raises
    ------
    TypeError
        Any other dtype.

    Examples
    --------
    >>> from_ml_dtypes(np.array([1.5], np.float16)).tolist()
    [1.5]
    """
    arr = np.asarray(a)
    if arr.dtype.name not in _STORAGE:
        raise TypeError(
            f"a must have one of the dtypes {sorted(_STORAGE)}; got dtype {arr.dtype}"
        )
    fmt = get_format(arr.dtype.name)
    raw = arr.view(f"u{arr.dtype.itemsize}") & (2**fmt.bits - 1)
    return decode(raw, fmt)


def _storage_of(fmt: Format) -> np.dtype:
    named = get_format(fmt.name) if fmt.name in _STORAGE else None
    if named is None or named != fmt:
        raise ValueError(
            f"format {fmt.name!r} has no numpy/ml_dtypes storage type; named formats with "
            f"one: {sorted(_STORAGE)}"
        )
    return _STORAGE[fmt.name]


@dataclass(frozen=True)
class BitLayout:
    """The fields of one code and how they make its value (`str()` explains it).

    Attributes
    ----------
    fmt : Format
        The format.
    value : float
        The value asked for.
    rounded : float
        The value of `code` (`value` rounded to `fmt`).
    code : int
        The code, an unsigned integer of `fmt.bits` bits.
    sign : int
        The sign bit (0 for unsigned formats).
    exponent : int
        The biased exponent field.
    mantissa : int
        The mantissa field.
    kind : str
        `"normal"`, `"subnormal"`, `"zero"`, `"inf"` or `"nan"`.
    """

    fmt: Format
    value: float
    rounded: float
    code: int
    sign: int
    exponent: int
    mantissa: int
    kind: str

    def __str__(self) -> str:
        f = self.fmt
        e, m = f.exponent_bits, f.mantissa_bits
        fields = [format(self.exponent, f"0{e}b")] + ([format(self.mantissa, f"0{m}b")] if m
                                                       else [])
        if f.signed:
            fields.insert(0, str(self.sign))
        width = (f.bits + 3) // 4
        lines = [f"{self.value!r} in {f.name} (E{e}M{m}, bias {f.bias}): "
                 f"code 0x{self.code:0{width}x} = {' '.join(fields)}"]
        w = max(e, m)
        if f.signed:
            lines.append(f"  sign      {self.sign:<{w}}  -> {'-' if self.sign else '+'}")
        lines.append(f"  exponent  {fields[-2 if m else -1]:<{w}}  = {self.exponent}")
        if m:
            lines.append(f"  mantissa  {fields[-1]:<{w}}  = {self.mantissa}/{2**m}")
        s = "-" if self.sign else "+"
        if self.kind == "normal":
            how = (f"{s}(1 + {self.mantissa}/{2**m}) * 2^({self.exponent} - {f.bias})"
                   if m else f"{s}2^({self.exponent} - {f.bias})")
        elif self.kind == "subnormal":
            how = f"{s}({self.mantissa}/{2**m}) * 2^(1 - {f.bias})"
        else:
            how = {"zero": f"{s}0", "inf": f"{s}inf", "nan": "NaN"}[self.kind]
        lines.append(f"  {self.kind}: {how} = {self.rounded!r}")
        if self.rounded != self.value and self.kind != "nan":
            lines.append(f"  ({self.value!r} is not representable; it rounds to {self.rounded!r})")
        elif self.kind == "nan" and self.value == self.value:  # a number that became NaN
            lines.append("  (not representable: rounds to NaN)")
        return "\n".join(lines)


def bit_layout(value: Any, fmt: Format | str, *, rounding: str = "nearest",
               saturate: bool = False) -> BitLayout:
    """Round one value to `fmt` and show its sign, exponent and mantissa fields.

    The value is rounded once from float64 with [quantize][normlab.precision.quantize]
    (`rounding` and `saturate` as there); `str()` of the result prints the fields and the
    formula that makes the value (normal, subnormal, zero, inf or NaN).

    Parameters
    ----------
    value : float
        One real number (or a 0-d float array).
    fmt : Format or str
        The format, or its name.
    rounding : str
        A deterministic rounding mode, default `"nearest"` (`"stochastic"` is not accepted:
        it needs randomness).
    saturate : bool
        Overflow and infinities become +-max instead of inf/NaN.

    Returns
    -------
    BitLayout
        The code and its fields; `print()` it to read them.

    Raises
    ------
    TypeError
        value is not one real number.
    ValueError
        The rounded value has no code (NaN in fp6/fp4), unknown format or mode.

    Examples
    --------
    >>> print(bit_layout(1.5, "e4m3"))  # doctest: +ELLIPSIS
    1.5 in float8_e4m3fn (E4M3, bias 7): code 0x3c = 0 0111 100
    ...
    """
    fmt = get_format(fmt)
    v = np.asarray(value, dtype=np.float64) if not isinstance(value, np.ndarray) else value
    if v.shape != () or not np.issubdtype(v.dtype, np.floating):
        raise TypeError(f"value must be one real number; got {value!r}")
    v64 = v.astype(np.float64).reshape(1)
    with np.errstate(all="ignore"):
        rounded = quantize(v64, fmt, rounding=rounding, saturate=saturate)
    code = int(encode(rounded, fmt)[0])
    r = float(rounded[0])
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    sign = (code >> (e + m)) & 1 if fmt.signed else 0
    expo, mant = (code >> m) & (2**e - 1), code & (2**m - 1)
    if np.isnan(r):
        kind = "nan"
    elif np.isinf(r):
        kind = "inf"
    elif r == 0:
        kind = "zero"
    else:
        kind = "subnormal" if expo == 0 and fmt.has_subnormals else "normal"
    return BitLayout(fmt, float(v64[0]), r, code, sign, expo, mant, kind)
