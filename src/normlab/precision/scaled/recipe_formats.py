"""The formats and rule names the recipes refer to: HYBRID roles, MX elements and rules.

[normlab.precision.scaled.recipes][] holds the recipes; this module holds what they look up
(and what the NumPy functions and their torch twins resolve the same way): the FP8 format
of an operand's role, the MX element formats (MXINT8 included) and the MX scale-rule
names with their aliases.
"""

from __future__ import annotations

from typing import Any

from normlab.precision.formats.format import (
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    Format,
    NanConvention,
    get_format,
)
from normlab.precision.scaled.block_scales import MX_RULES

__all__ = [
    "AMAX_ALGOS",
    "FP8_FORMATS",
    "MXINT8",
    "ROLES",
    "fp8_format_for",
    "mx_element_format",
    "mx_scale_rule",
]

FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
"""FP8 format choices: HYBRID is E4M3 for forward operands and E5M2 for gradients."""

ROLES = ("forward", "backward")
"""Operand roles: `"forward"` (x, W) and `"backward"` (the gradient dy)."""

AMAX_ALGOS = ("max", "most_recent")
"""How delayed scaling reduces its amax history."""

MXINT8 = Format("mxint8", 1, 6, bias=1, nan=NanConvention.NONE)
r"""MXINT8's element (OCP MX v1.0 sec. 5.4.1): an 8-bit integer k with an implicit scale
$2^{-6}$, the fixed-point grid $k / 64$, $|k| \le 127$; held as E1M6 with bias 1 and no NaN
(max `0x1.fcp+0` = 1.984375, min_normal `0x1p+0`, min_subnormal `0x1p-6` = 0.015625)."""

_MX_ELEMENTS = {"int8": MXINT8, "mxint8": MXINT8}
_MX_RULE_ALIASES = {"ocp": "ocp", "floor": "ocp", "round_up": "round_up", "te": "round_up",
                    "transformer_engine": "round_up", "ceil": "round_up"}


def fp8_format_for(fp8_format: str, role: str) -> Format:
    """The FP8 format of an operand of `role` under `fp8_format`.

    Parameters
    ----------
    fp8_format : {"HYBRID", "E4M3", "E5M2"}
        The recipe's choice (upper case).
    role : {"forward", "backward"}
        The operand's role.

    Returns
    -------
    fmt : Format
        E5M2 for `"E5M2"` and for HYBRID's gradients, else E4M3.

    Raises
    ------
    ValueError
        If `role` is not a role.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}; got {role!r}")
    if fp8_format == "E5M2" or (fp8_format == "HYBRID" and role == "backward"):
        return FLOAT8_E5M2
    return FLOAT8_E4M3FN


def mx_element_format(elem: Any) -> Format:
    """An MX element format: a Format, a format name, or `"int8"` for MXINT8.

    Raises
    ------
    ValueError
        If `elem` names no format.
    """
    key = elem.lower() if isinstance(elem, str) else None
    return _MX_ELEMENTS[key] if key in _MX_ELEMENTS else get_format(elem)


def mx_scale_rule(rule: Any) -> str:
    """The MX scale rule `"ocp"` or `"round_up"` named by `rule` or one of its aliases
    (`"floor"`; `"te"`, `"transformer_engine"`, `"ceil"`).

    Raises
    ------
    ValueError
        If `rule` names no rule (the message lists them).
    """
    found = _MX_RULE_ALIASES.get(rule.lower()) if isinstance(rule, str) else None
    if found is None:
        raise ValueError(f"scale_rule must be one of {MX_RULES} (aliases "
                         f"{sorted(_MX_RULE_ALIASES)}); got {rule!r}")
    return found
