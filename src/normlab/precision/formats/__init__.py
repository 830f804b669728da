"""Formats and rounding: binary float formats as data, their bit codes, exact rounding.

* [format][normlab.precision.formats.format]: the frozen `Format` and the named formats;
* `codes`: encode and decode bit codes, ml_dtypes storage, the bit-layout view;
* `rounding` and `modes`: exact rounding of arrays to any format, the rounding modes;
* `random_bits`: the counter-based random words of stochastic rounding;
* `table`: the table `normlab formats` prints.

Every name of the old module `normlab.precision.formats` (the format definitions) is
importable from this package, as before.
"""

from __future__ import annotations

from normlab.precision.formats.format import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3B11FNUZ,
    FLOAT8_E4M3FN,
    FLOAT8_E4M3FNUZ,
    FLOAT8_E5M2,
    FLOAT8_E5M2FNUZ,
    FLOAT8_E8M0FNU,
    FLOAT16,
    FLOAT32,
    NAMED_FORMATS,
    Format,
    NanConvention,
    get_format,
)

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
