"""Binary floating-point formats as data: a frozen `Format` and the named instances.

A format with `e` exponent bits, `m` mantissa bits and bias `b` encodes the value

    normal     (-1)^s * 2^(E - b) * (1 + M / 2^m)      exponent field E >= 1
    subnormal  (-1)^s * 2^(1 - b) * (M / 2^m)          exponent field E == 0

The conventions that differ between formats are fields: whether the top exponent field is
reserved for infinities and NaNs (`NanConvention.IEEE`), whether only the all-ones code of
each sign is NaN (`NanConvention.FN`, the "finite" fp8 formats), whether the one code
"negative zero" (sign bit alone) is the only NaN and there is no -0 (`NanConvention.FNUZ`,
the AMD/Graphcore fp8 formats), or whether every code is finite (`NanConvention.NONE`:
fp6, fp4). Whether a format has infinities is derived from that convention (only IEEE
has them). A format without subnormals keeps exponent field 0 for zero only (flush to
zero) or, with `has_zero=False`, uses it as a binade (E8M0, the MX scale: 2^-127 ... 2^127).

References: IEEE 754-2019; Micikevicius et al. 2022; Noune et al. 2022 (fnuz); OCP MX v1.0.

Examples
--------
>>> get_format("e4m3").max
448.0
"""

from __future__ import annotations

import enum
import re
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BFLOAT16",
    "FLOAT4_E2M1FN",
    "FLOAT6_E2M3FN",
    "FLOAT6_E3M2FN",
    "FLOAT8_E4M3B11FNUZ",
    "FLOAT8_E4M3FN",
    "FLOAT8_E4M3FNUZ",
    "FLOAT8_E5M2",
    "FLOAT8_E5M2FNUZ",
    "FLOAT8_E8M0FNU",
    "FLOAT16",
    "FLOAT32",
    "NAMED_FORMATS",
    "Format",
    "NanConvention",
    "get_format",
]


class NanConvention(enum.Enum):
    """How a format spends codes on NaN (and infinity)."""

    IEEE = "ieee"
    """The top exponent field: mantissa 0 is +-inf, any other mantissa is NaN."""
    FN = "fn"
    """No infinities; only the all-ones magnitude code of each sign is NaN (E4M3FN)."""
    NONE = "none"
    """No NaN and no infinity: every code is a finite number (fp6, fp4)."""
    FNUZ = "fnuz"
    """No infinities, no -0: the code `1 << (bits - 1)` ("-0") is the only NaN."""



_UNSET: Any = object()


@dataclass(frozen=True, init=False)
class Format:
    """A binary float format: sign, `exponent_bits`, `mantissa_bits`, bias, specials.

    Parameters
    ----------
    name : str
        A label (the named formats use ml_dtypes' type names).
    exponent_bits, mantissa_bits : int
        Field widths; exponent_bits >= 1, mantissa_bits >= 0, at most 32 bits in total.
    bias : int, optional
        Exponent bias; default `2**(exponent_bits - 1) - 1`.
    has_infinity : bool, optional
        Deprecated (a DeprecationWarning): checked against `nan`, from which
        [has_infinity][normlab.precision.Format.has_infinity] is derived.
    nan : NanConvention or str
        Where the specials are: `"ieee"`, `"fn"`, `"fnuz"` or `"none"` (see
        [NanConvention][normlab.precision.NanConvention]).
    has_subnormals : bool
        Exponent field 0 holds subnormals (`M / 2^m * 2^(1 - bias)`).
    signed : bool
        Whether a sign bit exists; an unsigned format maps negative inputs to NaN.
    has_zero : bool
        False only together with `has_subnormals=False`: exponent field 0 is then an
        ordinary binade (E8M0). With `has_subnormals=False, has_zero=True` field 0 is
        zero only and quantisation flushes results below `min_normal` to zero.

    Raises
    ------
    ValueError
        Impossible formats: no exponent bits, over 32 bits, IEEE specials without room, values
        outside float32's range, `has_infinity` contradicting `nan`, an unsigned fnuz format.

    Examples
    --------
    >>> Format("e4m3fnuz", 4, 3, bias=8, nan="fnuz").max
    240.0
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    nan: NanConvention
    has_subnormals: bool
    signed: bool
    has_zero: bool

    def __init__(
        self,
        name: str,
        exponent_bits: int,
        mantissa_bits: int,
        bias: int | None = None,
        has_infinity: Any = _UNSET,
        nan: NanConvention | str = NanConvention.IEEE,
        has_subnormals: bool = True,
        signed: bool = True,
        has_zero: bool = True,
    ) -> None:
        for label, v in (("name", name), ("exponent_bits", exponent_bits),
                         ("mantissa_bits", mantissa_bits), ("bias", bias), ("nan", nan),
                         ("has_subnormals", has_subnormals), ("signed", signed),
                         ("has_zero", has_zero)):
            object.__setattr__(self, label, v)
        self.__post_init__()
        if has_infinity is not _UNSET:
            warnings.warn(
                "Format(has_infinity=...) is deprecated: it is derived from nan (True exactly "
                "for nan='ieee'); pass nan only", DeprecationWarning, stacklevel=2,
            )
            if bool(has_infinity) != self.has_infinity:
                raise ValueError(
                    "Format has_infinity=True goes with nan='ieee' (the top exponent field "
                    f"holds inf and NaN) and only with it; got has_infinity={has_infinity}, "
                    f"nan={self.nan.value!r}"
                )

    def __post_init__(self) -> None:
        e, m = self.exponent_bits, self.mantissa_bits
        for label, v in (("exponent_bits", e), ("mantissa_bits", m)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Format {label} must be an int; got {v!r}")
        if e < 1:
            raise ValueError(f"Format needs at least one exponent bit; got exponent_bits={e}")
        if m < 0:
            raise ValueError(f"Format mantissa_bits must be >= 0; got {m}")
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (e - 1) - 1)
        elif isinstance(self.bias, bool) or not isinstance(self.bias, int):
            raise TypeError(f"Format bias must be an int or None; got {self.bias!r}")
        try:
            object.__setattr__(self, "nan", NanConvention(self.nan))
        except ValueError:
            raise ValueError(
                f"Format nan must be one of {[c.value for c in NanConvention]}; got {self.nan!r}"
            ) from None
        self._check_conventions()
        if self.bits > 32:
            raise ValueError(f"Format {self.name!r} has {self.bits} bits; at most 32 are supported")
        if m > 23 or self.emax > 127 or self.emin - (m if self.has_subnormals else 0) < -149:
            raise ValueError(
                f"Format {self.name!r} (E{e}M{m}, bias {self.bias}) is not within float32's "
                f"range: need mantissa_bits <= 23, emax <= 127 and smallest value >= 2^-149; "
                f"got emax={self.emax}, emin={self.emin}"
            )
        if self.emax < self.emin:
            raise ValueError(f"Format {self.name!r} has no finite normal numbers")

    def _check_conventions(self) -> None:
        ieee = self.nan is NanConvention.IEEE
        if ieee and (self.exponent_bits < 2 or self.mantissa_bits < 1):
            raise ValueError(
                "IEEE specials need exponent_bits >= 2 and mantissa_bits >= 1 (room for inf "
                f"and NaN); got E{self.exponent_bits}M{self.mantissa_bits}"
            )
        if not self.has_zero and self.has_subnormals:
            raise ValueError("has_zero=False requires has_subnormals=False (E8M0 convention)")
        if not self.signed and self.nan is NanConvention.NONE:
            raise ValueError("an unsigned format needs a NaN code for negative inputs")
        if self.nan is NanConvention.FN and self.exponent_bits + self.mantissa_bits < 2:
            raise ValueError("nan='fn' needs at least two magnitude bits")
        if self.nan is NanConvention.FNUZ and not (self.signed and self.has_zero):
            raise ValueError(
                "nan='fnuz' spends the sign bit's negative-zero code on NaN: it needs "
                f"signed=True and has_zero=True; got signed={self.signed}, "
                f"has_zero={self.has_zero}"
            )

    @property
    def bits(self) -> int:
        """Total storage bits: sign (if signed) + exponent + mantissa."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def has_infinity(self) -> bool:
        """True exactly for the IEEE NaN convention (the top exponent field holds +-inf)."""
        return self.nan is NanConvention.IEEE

    @property
    def has_negative_zero(self) -> bool:
        """False for unsigned formats and for fnuz (its "-0" code is the NaN)."""
        return self.signed and self.nan is not NanConvention.FNUZ

    @property
    def has_nan(self) -> bool:
        """True unless the format spends no code on NaN (fp6, fp4)."""
        return self.nan is not NanConvention.NONE

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite binade."""
        top = 2**self.exponent_bits - 1
        if self.nan is NanConvention.IEEE or (
            self.nan is NanConvention.FN and self.mantissa_bits == 0
        ):
            top -= 1  # the all-ones exponent field holds no finite number
        return top - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return (1 if self.has_zero else 0) - self.bias

    @property
    def max_significand(self) -> int:
        """Largest integer significand (implicit bit included) in the top binade."""
        full = 2 ** (self.mantissa_bits + 1) - 1
        if self.nan is NanConvention.FN and self.mantissa_bits > 0:
            return full - 1  # the all-ones mantissa of the top binade is NaN
        return full

    @property
    def max(self) -> float:
        """Largest finite value: `max_significand * 2^(emax - m)`."""
        return float(self.max_significand * 2.0 ** (self.emax - self.mantissa_bits))

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value `2^emin` (finfo's `tiny`)."""
        return float(2.0**self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value: `2^(emin - m)`, or `min_normal` without subnormals."""
        if not self.has_subnormals:
            return self.min_normal
        return float(2.0 ** (self.emin - self.mantissa_bits))

    @property
    def eps(self) -> float:
        """Gap between 1 and the next larger value: `2^-m`."""
        return float(2.0**-self.mantissa_bits)

    def __str__(self) -> str:
        return self.name


# Named formats. Each docstring gives the constants as hex floats (decimal in parentheses),
# as ml_dtypes.finfo has them.
FLOAT32 = Format("float32", 8, 23)
"""IEEE binary32 (E8M23): max 0x1.fffffep+127 (3.4028235e38), min_normal 0x1p-126
(1.1754944e-38), min_subnormal 0x1p-149 (1.4e-45), eps 0x1p-23 (1.1920929e-07)."""
BFLOAT16 = Format("bfloat16", 8, 7)
"""bfloat16 (E8M7, float32's range): max 0x1.fep+127 (3.3895314e38), min_normal 0x1p-126,
min_subnormal 0x1p-133 (9.18e-41), eps 0x1p-7 (0.0078125)."""
FLOAT16 = Format("float16", 5, 10)
"""IEEE binary16 (E5M10): max 0x1.ffcp+15 (65504), min_normal 0x1p-14 (6.1035156e-05),
min_subnormal 0x1p-24 (5.9604645e-08), eps 0x1p-10 (0.0009765625)."""
FLOAT8_E4M3FN = Format("float8_e4m3fn", 4, 3, nan=NanConvention.FN)
"""FP8 E4M3 (OCP): max 0x1.cp+8 (448), min_normal 0x1p-6 (0.015625), min_subnormal 0x1p-9
(0.001953125), eps 0x1p-3 (0.125); NaN = 0x7f / 0xff, no infinity."""
FLOAT8_E5M2 = Format("float8_e5m2", 5, 2)
"""FP8 E5M2 (OCP, IEEE specials): max 0x1.cp+15 (57344), min_normal 0x1p-14
(6.1035156e-05), min_subnormal 0x1p-16 (1.5258789e-05), eps 0x1p-2 (0.25)."""
FLOAT6_E3M2FN = Format("float6_e3m2fn", 3, 2, nan=NanConvention.NONE)
"""FP6 E3M2 (OCP MX): max 0x1.cp+4 (28), min_normal 0x1p-2 (0.25), min_subnormal 0x1p-4
(0.0625), eps 0x1p-2 (0.25); no inf or NaN."""
FLOAT6_E2M3FN = Format("float6_e2m3fn", 2, 3, nan=NanConvention.NONE)
"""FP6 E2M3 (OCP MX): max 0x1.ep+2 (7.5), min_normal 0x1p+0 (1), min_subnormal 0x1p-3
(0.125), eps 0x1p-3 (0.125); no inf or NaN."""
FLOAT4_E2M1FN = Format("float4_e2m1fn", 2, 1, nan=NanConvention.NONE)
"""FP4 E2M1 (OCP MX, NVFP4 elements): max 0x1.8p+2 (6), min_normal 0x1p+0 (1),
min_subnormal 0x1p-1 (0.5), eps 0x1p-1 (0.5); no inf or NaN."""
FLOAT8_E8M0FNU = Format(
    "float8_e8m0fnu", 8, 0, nan=NanConvention.FN,
    has_subnormals=False, signed=False, has_zero=False,
)
"""E8M0 (the OCP MX scale format, unsigned): max 0x1p+127 (1.7014118e38),
min_normal = min_subnormal 0x1p-127 (5.877472e-39), eps 0x1p+0 (1); no zero, NaN = 0xff."""
FLOAT8_E4M3FNUZ = Format("float8_e4m3fnuz", 4, 3, bias=8, nan=NanConvention.FNUZ)
"""FP8 E4M3 fnuz (AMD / Graphcore, bias 8): max 0x1.ep+7 (240), min_normal 0x1p-7
(0.0078125), min_subnormal 0x1p-10 (0.0009765625), eps 0x1p-3 (0.125); NaN = 0x80 only,
no infinity, no -0."""
FLOAT8_E5M2FNUZ = Format("float8_e5m2fnuz", 5, 2, bias=16, nan=NanConvention.FNUZ)
"""FP8 E5M2 fnuz (bias 16): max 0x1.cp+15 (57344), min_normal 0x1p-15 (3.0517578e-05),
min_subnormal 0x1p-17 (7.6293945e-06), eps 0x1p-2 (0.25); NaN = 0x80 only."""
FLOAT8_E4M3B11FNUZ = Format("float8_e4m3b11fnuz", 4, 3, bias=11, nan=NanConvention.FNUZ)
"""FP8 E4M3 fnuz with bias 11 (Graphcore): max 0x1.ep+4 (30), min_normal 0x1p-10
(0.0009765625), min_subnormal 0x1p-13 (0.00012207031), eps 0x1p-3 (0.125); NaN = 0x80
only."""

NAMED_FORMATS: tuple[Format, ...] = (
    FLOAT32, BFLOAT16, FLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2,
    FLOAT6_E3M2FN, FLOAT6_E2M3FN, FLOAT4_E2M1FN, FLOAT8_E8M0FNU,
    FLOAT8_E4M3FNUZ, FLOAT8_E5M2FNUZ, FLOAT8_E4M3B11FNUZ,
)
"""Every named format, in the order of the `normlab formats` table."""

_ALIASES: dict[str, Format] = {name: fmt for fmt, names in (
    (FLOAT32, ("fp32", "f32", "float32", "single", "e8m23")),
    (BFLOAT16, ("bf16", "bfloat16", "e8m7")),
    (FLOAT16, ("fp16", "f16", "half", "float16", "e5m10")),
    (FLOAT8_E4M3FN, ("e4m3", "e4m3fn", "fp8_e4m3", "fp8_e4m3fn", "float8_e4m3fn")),
    (FLOAT8_E5M2, ("e5m2", "fp8_e5m2", "float8_e5m2")),
    (FLOAT6_E3M2FN, ("e3m2", "e3m2fn", "fp6_e3m2", "fp6_e3m2fn", "float6_e3m2fn")),
    (FLOAT6_E2M3FN, ("e2m3", "e2m3fn", "fp6_e2m3", "fp6_e2m3fn", "float6_e2m3fn")),
    (FLOAT4_E2M1FN, ("fp4", "e2m1", "e2m1fn", "fp4_e2m1", "fp4_e2m1fn", "float4_e2m1fn")),
    (FLOAT8_E8M0FNU, ("e8m0", "e8m0fnu", "ue8m0", "fp8_e8m0", "float8_e8m0fnu")),
    (FLOAT8_E4M3FNUZ, ("e4m3fnuz", "fp8_e4m3fnuz", "float8_e4m3fnuz")),
    (FLOAT8_E5M2FNUZ, ("e5m2fnuz", "fp8_e5m2fnuz", "float8_e5m2fnuz")),
    (FLOAT8_E4M3B11FNUZ, ("e4m3b11fnuz", "e4m3b11", "fp8_e4m3b11fnuz", "float8_e4m3b11fnuz")),
) for name in names}

# "e3m4", "float8_e3m4", "e4m3fn", "e5m2fnu": any ExMy, IEEE specials unless "fn"/"fnu".
_EXMY = re.compile(r"^(?:(?:float|fp)(\d+)_)?e(\d+)m(\d+)(fn|fnu)?$")


def _parse_exmy(key: str) -> Format | None:
    match = _EXMY.match(key)
    if match is None:
        return None
    width, e, m, suffix = match.groups()
    e_bits, m_bits = int(e), int(m)
    signed = suffix != "fnu"
    if width is not None and int(width) != int(signed) + e_bits + m_bits:
        raise ValueError(f"format name {key!r}: {width} bits do not hold a sign, E{e}, M{m}")
    if suffix is None:
        return Format(key, e_bits, m_bits)
    return Format(key, e_bits, m_bits, nan=NanConvention.FN, signed=signed,
                  has_subnormals=signed, has_zero=signed)


def get_format(name_or_format: Any) -> Format:
    """Return the [Format][normlab.precision.Format] for a name, alias, dtype or `Format`.

    Accepts the named formats' ml_dtypes names (`"float8_e4m3fn"`), the common aliases
    (`bf16`, `fp16`, `half`, `e4m3`, `e5m2`, `fp6_e3m2`, `fp4`, `e8m0`, ...), numpy,
    ml_dtypes and torch dtypes of those types (torch's packed `float4_e2m1fn_x2` gives the
    element format), any `"eXmY"` (IEEE specials) or `"eXmYfn"` (finite, all-ones NaN)
    within float32's range. Case-insensitive.

    Raises
    ------
    ValueError
        Unknown name (the message lists the known ones) or an impossible ExMy.
    TypeError
        Neither a str, a dtype nor a Format.

    Examples
    --------
    >>> get_format("bf16") is BFLOAT16
    True
    """
    if isinstance(name_or_format, Format):
        return name_or_format
    if name_or_format is None:  # np.dtype(None) would read it as float64
        raise TypeError("fmt must be a Format or a format name such as 'bf16'; got None")
    if f"{type(name_or_format).__module__}.{type(name_or_format).__name__}" == "torch.dtype":
        # a torch dtype, recognised by name so that this module never imports torch
        name_or_format = str(name_or_format).removeprefix("torch.").removesuffix("_x2")
    if not isinstance(name_or_format, str):
        try:
            import numpy as np

            name_or_format = np.dtype(name_or_format).name
        except TypeError:
            raise TypeError(
                f"fmt must be a Format or a format name; got {type(name_or_format).__name__} "
                f"{name_or_format!r}"
            ) from None
    key = name_or_format.strip().lower().replace("-", "_")
    if key in _ALIASES:
        return _ALIASES[key]
    parsed = _parse_exmy(key)
    if parsed is not None:
        return parsed
    raise ValueError(
        f"unknown float format {name_or_format!r}; known names: {', '.join(sorted(_ALIASES))} "
        "(or any 'eXmY' / 'eXmYfn' within float32's range, or a Format)"
    )
