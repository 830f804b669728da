"""The table of the named formats printed by `normlab formats`."""

from __future__ import annotations

from normlab.precision.formats.format import NAMED_FORMATS

__all__ = ["formats_table"]


def formats_table() -> str:
    """A plain-text table of the named formats and their finfo-like constants.

    Examples
    --------
    >>> print(formats_table().splitlines()[0])  # doctest: +ELLIPSIS
    name ...
    """
    header = ("name", "bits", "E", "M", "bias", "inf", "NaN", "subn", "max", "min_normal",
              "min_subnormal", "eps")
    rows = [header]
    for f in NAMED_FORMATS:
        rows.append((
            f.name, str(f.bits), str(f.exponent_bits), str(f.mantissa_bits), str(f.bias),
            "yes" if f.has_infinity else "no", f.nan.value,
            "yes" if f.has_subnormals else "no",
            f"{f.max:.6g}", f"{f.min_normal:.6g}", f"{f.min_subnormal:.6g}", f"{f.eps:.6g}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
