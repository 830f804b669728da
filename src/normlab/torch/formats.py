"""Formats of torch dtypes: `get_format` accepts `torch.bfloat16`, `torch.float8_*`.

Contract: a torch dtype maps to the [Format][normlab.precision.Format] of the same name
(`torch.float8_e4m3fn` -> `FLOAT8_E4M3FN`); `torch.float4_e2m1fn_x2` (two packed
E2M1 values a byte) maps to the element format `FLOAT4_E2M1FN`. Everything else is
[normlab.precision.get_format][], which recognises torch dtypes by name without
importing torch. Formats are data shared with the NumPy side, never copied.
"""

from __future__ import annotations

from typing import Any

from normlab._moved import renamed_arguments
from normlab.precision.formats.format import (
    BFLOAT16,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT16,
    Format,
)
from normlab.precision.formats.format import get_format as _get_format
from normlab.torch._import import torch

__all__ = ["NATIVE_DTYPES", "get_format", "quiet_nan_where"]

NATIVE_DTYPES: dict[Format, torch.dtype] = {
    BFLOAT16: torch.bfloat16,
    FLOAT16: torch.float16,
    FLOAT8_E4M3FN: torch.float8_e4m3fn,
    FLOAT8_E5M2: torch.float8_e5m2,
}
"""The formats whose torch dtype's float32 cast rounds to nearest even as the reference
does on every finite input below the overflow threshold: the one table from a `Format` to
the dtype a rounding engine may cast through (`quantize`, its CPU chunks, the operands)."""


def quiet_nan_where(bad: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out`, with the quiet NaN of `x`'s sign where `bad`: the one NaN rule of the casts.

    The reference ([normlab.precision.quantize][]) gives a NaN input (and, in a format
    without infinities, an input beyond its NaN threshold) the quiet NaN `0x7FC00000` with
    the input's sign; a cast keeps payloads or drops the sign, so every cast path applies
    this rule to its result. The NaN is a fill on `out`'s device, no host-to-device copy.
    """
    nan = out.new_full((), float("nan"))
    return torch.where(bad, torch.copysign(nan, x), out)


@renamed_arguments(fmt="name_or_format")
def get_format(name_or_format: Any) -> Format:
    """Return the [Format][normlab.precision.Format] for a torch dtype, name or `Format`.

    Parameters
    ----------
    name_or_format : torch.dtype, Format, str or numpy/ml_dtypes dtype
        torch float dtypes up to 32 bits: float32, bfloat16, float16, the float8 types
        (e4m3fn, e5m2, e8m0fnu; the fnuz types once the format table has them) and
        float4_e2m1fn_x2 (the element format).

    Returns
    -------
    fmt : Format
        The format of that dtype or name.

    Raises
    ------
    ValueError
        A torch dtype without a normlab format (float64, integer types): the message
        names the dtype and the known formats.
    TypeError
        Neither a dtype, a name nor a Format.

    Examples
    --------
    >>> get_format(torch.float8_e4m3fn).max
    448.0
    """
    if isinstance(name_or_format, torch.dtype) and not name_or_format.is_floating_point:
        raise ValueError(f"name_or_format {name_or_format} is not a float dtype; pass a "
                         "float dtype or a Format")
    return _get_format(name_or_format)
