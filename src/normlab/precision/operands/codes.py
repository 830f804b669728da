"""Element codes of an operand kept for backward: lookup tables, encode, decode, packing.

A training GEMM's operand is saved as integer codes of its element format
(`normlab.precision.formats.codes` defines the bit layouts) plus scales
([normlab.precision.operands.operand][]). Element values map to codes by their position among
the format's finite magnitudes, plus the sign bit; a NaN takes the format's NaN code
(formats without one only meet NaN inside a block whose scale is NaN, which marks the
whole block). Each function is written once against the array namespace `xp`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab.precision.formats.codes import decode, encode
from normlab.precision.formats.format import Format, NanConvention
from normlab.precision.scaled.namespace import ArrayNamespace

__all__ = [
    "CodeTables",
    "Encoded",
    "code_tables",
    "element_codes",
    "element_values",
    "pack_pairs",
    "stores_codes",
    "unpack_pairs",
]


@dataclass(frozen=True)
class Encoded:
    """An operand as codes plus scales.

    What [encode_operand][normlab.precision.operands.operand.encode_operand] returns.

    Attributes
    ----------
    codes : array
        Element codes, uint8 (int16 for 16-bit formats; float32 values for formats without
        codes), stored with the layout's contiguous axis last: `(R, C)` for order "C",
        `(C, R)` for "F"; NVFP4 pairs two codes per byte along that axis.
    scales : array or None
        Per-block scales: E8M0 codes (MX, uint8), E4M3 codes (NVFP4, uint8), float32
        inverse scales (blockwise FP8, on the block grid; per-tensor FP8, 0-d); None for
        the elementwise kind.
    tensor_scale : array or None
        NVFP4's float32 decode scale $S_{dec}$ (0-d); None for the other kinds.
    """

    codes: Any
    scales: Any = None
    tensor_scale: Any = None


@dataclass(frozen=True)
class CodeTables:
    """Lookup tables of one format's codes.

    Attributes
    ----------
    values : numpy.ndarray
        float32 value of every code (NaN codes: the quiet NaN with the code's sign).
    magnitudes : numpy.ndarray
        The finite non-negative values, increasing (code i has the value `magnitudes[i]`).
    nan_code : int
        The code of +NaN (0 for formats without NaN).
    inf_code : int
        The code of +inf (0 for formats without infinities).
    sign_bit : int
        The sign bit's position.
    """

    values: np.ndarray
    magnitudes: np.ndarray
    nan_code: int
    inf_code: int
    sign_bit: int


def stores_codes(fmt: Format) -> bool:
    """Whether operands of `fmt` are kept as codes: signed formats with a zero, 16 bits or
    fewer (the others are kept as float32 values)."""
    return fmt.signed and fmt.has_zero and fmt.bits <= 16


@functools.lru_cache(maxsize=32)
def code_tables(fmt: Format) -> CodeTables:
    """The [CodeTables][normlab.precision.operands.codes.CodeTables] of `fmt` (a format that
    [stores_codes][normlab.precision.operands.codes.stores_codes])."""
    values = decode(np.arange(2**fmt.bits, dtype=np.uint32), fmt)
    half = values[: 2 ** (fmt.bits - 1)]
    finite = int(np.argmax(~np.isfinite(half))) if not np.isfinite(half).all() else half.size
    nan = int(encode(np.array([np.nan], np.float32), fmt)[0]) if fmt.has_nan else 0
    inf = int(encode(np.array([np.inf], np.float32), fmt)[0]) if fmt.has_infinity else 0
    if fmt.nan is NanConvention.FNUZ:
        finite = half.size  # the NaN code is the sign bit alone
    return CodeTables(values, np.ascontiguousarray(half[:finite]), nan, inf, fmt.bits - 1)


def element_codes(v: Any, fmt: Format, xp: ArrayNamespace) -> Any:
    """The codes of float32 values `v` that `fmt` represents (NaN: the NaN code)."""
    if not stores_codes(fmt):
        return v
    t = code_tables(fmt)
    index = xp.searchsorted(xp.constant(t.magnitudes, v), xp.abs(v))
    index = xp.where(xp.isinf(v), xp.scalar(t.inf_code, index), index)
    index = xp.where(xp.isnan(v), xp.scalar(t.nan_code, index), index)
    sign = xp.astype(xp.bits32(v) < xp.scalar(0, xp.bits32(v)), "int64")
    code = index | (sign << t.sign_bit)
    return xp.astype(code, "uint8" if fmt.bits <= 8 else "int16")


def element_values(codes: Any, fmt: Format, xp: ArrayNamespace) -> Any:
    """float32 values of element codes (float32 'codes' are values already)."""
    if not stores_codes(fmt):
        return codes
    table = xp.constant(code_tables(fmt).values, codes)
    return table[xp.astype(codes, "int64") & (2**fmt.bits - 1)]


def pack_pairs(stored: Any, xp: ArrayNamespace) -> Any:
    """Two 4-bit codes per byte along the last axis (the even element in the low half)."""
    padded = xp.pad_end(stored, (0, stored.shape[1] % 2))
    return padded[:, 0::2] | (padded[:, 1::2] << 4)


def unpack_pairs(packed: Any, n: int, xp: ArrayNamespace) -> Any:
    """The first `n` 4-bit codes per row of `pack_pairs`' bytes, as their own elements."""
    lo, hi = packed & 15, packed >> 4
    pairs = xp.concat([lo[:, :, None], hi[:, :, None]], axis=2)
    return xp.reshape(pairs, (packed.shape[0], 2 * packed.shape[1]))[:, :n]
