"""MX block quantisation: blocks of k elements along an axis share one E8M0 scale.

Contract: a block V_1..V_k (k = block_size, 32 in the OCP formats) is stored as a
power-of-two scale X = 2^e (an E8M0 code e + 127, e in [-127, 127], code 255 = NaN) and
elements P_i = sat_round(V_i / X) in the element format (E4M3, E5M2, E3M2, E2M3, E2M1 or
any Format), rounded to nearest-even with saturation to +-max. Decoding is X * P_i.

Two rules choose e from the block's amax = max |V_i|:

- ``"ocp"`` (OCP Microscaling Formats spec v1.0, sec. 6.3):
  ``e = floor(log2(amax)) - emax_elem`` (emax_elem = exponent of the element format's
  largest binade: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1), then
  clamped to >= -127; e > 127 gives a NaN scale. Elements between max and 2^(emax+1)
  times X are clipped to max (the rule's known saturation).
- ``"round_up"`` (Transformer Engine's MXFP8 cast): ``X`` = the smallest power of two with
  ``amax / X <= elem_max``, computed as TE does in float32: ``v = float32(amax) *
  float32(1 / elem_max)``, then the E8M0 code of v rounded up (a non-zero fp32 mantissa
  adds one to the exponent; codes saturate at 254 = 2^127; v <= 2^-127 gives code 0).
  For normal float32 amax this equals the exact ceil(log2(amax / elem_max)) because
  float32(1/elem_max) is above 1/elem_max by less than half an ulp for these formats.

Special blocks: all zeros -> code 0 (2^-127) and zero elements, under both rules. A NaN
anywhere in a block -> NaN scale (code 255) and every element NaN (an NaN scale decodes the
whole block as NaN in the OCP spec). An infinity (no NaN) -> NaN scale under ``"ocp"``
(floor(log2 inf) exceeds the E8M0 range); code 254 under ``"round_up"``, the infinity
saturating to +-max and the finite elements flushing towards zero.
TE's kernel multiplies by 1 instead of 2^127 when the code is 0 (a special case of its
reciprocal helper); here V / X is always exact, which only matters for amax below about
1e-36.

MXINT8 (``elem_format="int8"``, OCP MX v1.0 sec. 5.4.1): the element is an 8-bit integer
k with an implicit scale 2^-6, so P_i = k / 64 with |k| <= 127, i.e. the fixed-point grid
0, 1/64, ..., 127/64 and its negatives. It is held as the Format :data:`MXINT8` (E1M6, bias
1, no NaN: subnormals k/64 for k < 64, the one normal binade 1 + j/64), so emax_elem = 0
and the element rounding is :func:`quantize`'s (nearest, ties to even, saturating to
+-127/64). The code -128 (-2.0) is never produced, as in microxcaling's MX reference
(symmetric clipping); ``element_codes()`` returns the two's-complement int8 k.

Length along the axis not divisible by block_size: ValueError, or with ``pad=True`` the
last block is padded with zeros (which changes no amax) and the elements are returned
unpadded.

Dimension letters: B blocks along the axis, K block_size, R all other axes flattened.
Rouhani et al., "Microscaling Data Formats for Deep Learning", 2023.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int
from normlab.precision import _blocks
from normlab.precision.codes import encode
from normlab.precision.formats import Format, NanConvention, get_format
from normlab.precision.rounding import quantize

__all__ = ["MXINT8", "MXTensor", "e8m0_scales", "mx_dequantize", "mx_quantize"]

# MXINT8 elements: k / 64, |k| <= 127 (see the module header)
MXINT8 = Format("mxint8", 1, 6, bias=1, nan=NanConvention.NONE)
# max 0x1.fcp+0 (1.984375), min_normal 0x1p+0, min_subnormal 0x1p-6 (0.015625)
_ELEM_ALIASES = {"int8": MXINT8, "mxint8": MXINT8}

_RULES = ("ocp", "round_up")
_RULE_ALIASES = {"ocp": "ocp", "floor": "ocp", "round_up": "round_up", "te": "round_up",
                 "transformer_engine": "round_up", "ceil": "round_up"}
_NAN_CODE = 255


def e8m0_scales(codes: np.ndarray) -> np.ndarray:
    """E8M0 codes (uint8) -> float32 scales 2^(code - 127); code 255 -> NaN."""
    c = np.asarray(codes).astype(np.int64)
    out = np.ldexp(np.ones(c.shape, np.float64), c - 127)
    out[c == _NAN_CODE] = np.nan
    return out.astype(np.float32)


@dataclass(frozen=True)
class MXTensor:
    """An MX-quantised array.

    elements: float32, x's shape, values of ``elem_format`` (NaN in NaN blocks).
    scale_codes: uint8 E8M0 codes, x's shape with the axis length replaced by B.
    """

    elements: np.ndarray
    scale_codes: np.ndarray
    elem_format: Format
    block_size: int
    axis: int

    @property
    def scales(self) -> np.ndarray:
        """The shared scales 2^(code - 127) as float32 (NaN for code 255)."""
        return e8m0_scales(self.scale_codes)

    def dequantize(self) -> np.ndarray:
        """X * P_i in float32 (see :func:`mx_dequantize`)."""
        return mx_dequantize(self)

    def element_codes(self) -> np.ndarray:
        """The elements' bit codes in ``elem_format`` (unsigned ints, x's shape).

        Elements of a NaN block are stored as code 0: the scale code 255 already makes the
        whole block NaN, and fp6/fp4 have no NaN code.
        """
        vals = np.where(np.isnan(self.elements), np.float32(0.0), self.elements)
        if self.elem_format == MXINT8:  # two's complement int8 k (the value is k / 64)
            return np.rint(vals * 64).astype(np.int8)
        return encode(vals.astype(np.float32), self.elem_format)


def _elem_emax(fmt: Format) -> int:
    """floor(log2(fmt.max)): the exponent of the element format's largest binade."""
    _, e = np.frexp(fmt.max)
    return int(e) - 1


def _ocp_exponent(amax: np.ndarray, emax_elem: int) -> np.ndarray:
    """floor(log2(amax)) - emax_elem clamped to >= -127; zero -> -127; > 127 or inf -> NaN."""
    finite_pos = np.isfinite(amax) & (amax > 0)
    _, ex = np.frexp(np.where(finite_pos, amax, 1.0))  # amax = f * 2^ex, f in [0.5, 1)
    e = (ex.astype(np.float64) - 1.0) - emax_elem
    e = np.where(finite_pos, np.maximum(e, -127.0), -127.0)
    return np.where(np.isfinite(amax) & (e <= 127), e, np.nan)


def _round_up_code(amax: np.ndarray, elem_max: float) -> np.ndarray:
    """Transformer Engine's float32 round-up to an E8M0 code (see the module header)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        v = (amax.astype(np.float32) * np.float32(1.0 / elem_max)).astype(np.float32)
    bits = v.view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int64)
    mantissa = bits & 0x7FFFFF
    bump = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    code = exponent + bump
    code = np.where(v == 0, 0, code)
    code = np.where(np.isinf(v), 0xFE, code)
    return np.where(np.isnan(v), _NAN_CODE, code)


def mx_quantize(
    x: Any,
    elem_format: Format | str = "e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "ocp",
    pad: bool = False,
) -> MXTensor:
    """Quantise ``x`` to MX: one E8M0 scale per ``block_size`` elements along ``axis``.

    Parameters
    ----------
    x: float array with at least one dimension. elem_format: element Format or name
    (``"e4m3"``, ``"e5m2"``, ``"fp6_e3m2"``, ``"fp6_e2m3"``, ``"fp4"``, ..., or ``"int8"``
    for MXINT8).
    block_size: integer >= 1. axis: the blocked axis. scale_rule: ``"ocp"`` (alias
    ``"floor"``) or ``"round_up"`` (aliases ``"te"``, ``"ceil"``). pad: allow a length that
    is not a multiple of block_size.

    Returns
    -------
    :class:`MXTensor`.

    Raises
    ------
    TypeError / ValueError: non-float x, bad block_size/axis/rule, indivisible length.

    Example
    -------
    >>> t = mx_quantize(np.array([1.0, 3.0, 0.3, -6.5]), "fp4", block_size=4)
    >>> t.scale_codes.tolist(), t.elements.tolist()   # amax 6.5: e = 2 - 2 = 0
    ([127], [1.0, 3.0, 0.5, -6.0])
    >>> t = mx_quantize(np.array([3.0, -0.1, 1.5, 0.02]), "int8", block_size=4)
    >>> t.scale_codes.tolist(), t.element_codes().tolist()   # X = 2^1; k = round(64 V / 2)
    ([128], [96, -3, 48, 1])
    """
    arr = as_float_array(x, "x", min_ndim=1)
    key = elem_format.lower() if isinstance(elem_format, str) else None
    fmt = _ELEM_ALIASES[key] if key in _ELEM_ALIASES else get_format(elem_format)
    k = check_int(block_size, "block_size", minimum=1)
    ax = check_int(axis, "axis")
    if not -arr.ndim <= ax < arr.ndim:
        raise ValueError(f"axis must be in [-{arr.ndim}, {arr.ndim}); got {axis}")
    ax %= arr.ndim
    rule = _RULE_ALIASES.get(str(scale_rule).lower()) if isinstance(scale_rule, str) else None
    if rule is None:
        raise ValueError(
            f"scale_rule must be one of {_RULES} (aliases {sorted(_RULE_ALIASES)}); "
            f"got {scale_rule!r}"
        )
    n = arr.shape[ax]
    if n % k and not pad:
        raise ValueError(
            f"x.shape[{ax}] = {n} is not a multiple of block_size = {k}; "
            "pass pad=True to zero-pad the last block"
        )
    moved = np.moveaxis(arr, ax, -1)  # ...,N
    with np.errstate(invalid="ignore"):
        amax = _blocks.block_amax(moved, (k,)).astype(np.float64)  # ...,B (NaN: a NaN)
    has_nan = np.isnan(amax)
    if rule == "ocp":
        e = _ocp_exponent(amax, _elem_emax(fmt))  # ...,B
        bad = has_nan | np.isnan(e)
        code = np.where(bad, _NAN_CODE, np.nan_to_num(e) + 127).astype(np.int64)
    else:
        code = _round_up_code(amax, fmt.max)
        bad = code == _NAN_CODE
    # V / 2^e is exact in the work dtype except where it falls below float32's normal
    # range, and every element format rounds such values to +-0 either way
    work = _blocks.work_dtype(arr)
    factor = np.ldexp(np.ones(code.shape), -np.where(bad, 0, code - 127)).astype(work)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = _blocks.multiply_blocks(moved.astype(work, copy=False), factor, (k,))
    elems = quantize(scaled, fmt, saturate=True).astype(np.float32, copy=False)  # ...,N
    if bad.any():
        elems[_blocks.expand(bad, (k,), elems.shape)] = np.nan
    return MXTensor(
        elements=np.moveaxis(elems, -1, ax),
        scale_codes=np.moveaxis(code.astype(np.uint8), -1, ax),
        elem_format=fmt,
        block_size=k,
        axis=ax,
    )


def mx_dequantize(t: MXTensor) -> np.ndarray:
    """``X * P_i`` in float32: each scale repeated over its block (NaN scale -> NaN block).

    Products beyond float32's range become inf (only possible for scales near 2^127).
    """
    if not isinstance(t, MXTensor):
        raise TypeError(f"t must be an MXTensor; got {type(t).__name__}")
    n = t.elements.shape[t.axis]
    codes = np.repeat(t.scale_codes.astype(np.int64), t.block_size, axis=t.axis)
    codes = np.take(codes, np.arange(n), axis=t.axis)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ldexp(t.elements.astype(np.float64), codes - 127)
        out[codes == _NAN_CODE] = np.nan
        return out.astype(np.float32)
