"""Formats and rounding: binary float formats as data, their bit codes, exact rounding.

* [format][normlab.precision.formats.format]: the frozen `Format` and the named formats;
* `codes`: encode and decode bit codes, ml_dtypes storage, the bit-layout view;
* `rounding` and `modes`: exact rounding of arrays to any format, the rounding modes;
* `random_bits`: the counter-based random words of stochastic rounding;
* `table`: the table `normlab formats` prints.

Every name of the old module `normlab.precision.formats` (the format definitions) is
importable from this package, as before, beside the public names of the other modules.
"""

# ruff: noqa: F403, F405  (star imports of modules with an explicit __all__, re-exported)
from __future__ import annotations

from normlab.precision.formats.codes import *
from normlab.precision.formats.format import *
from normlab.precision.formats.random_bits import splitmix64, stochastic_words
from normlab.precision.formats.rounding import *
from normlab.precision.formats.table import formats_table

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
    "BitLayout",
    "Format",
    "NanConvention",
    "RoundingMode",
    "bit_layout",
    "decode",
    "encode",
    "formats_table",
    "from_ml_dtypes",
    "get_format",
    "quantize",
    "splitmix64",
    "stochastic_words",
    "to_ml_dtypes",
]
