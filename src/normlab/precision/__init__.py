"""Float formats, exact rounding, loss scaling, mixed-precision training, fp8 and MX scaling."""

from __future__ import annotations

__all__: list[str] = []

# --- formats, rounding, codes, chapter listings (owner: formats) ---
from normlab.precision.formats import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    FLOAT16,
    FLOAT32,
    NAMED_FORMATS,
    Format,
    NanConvention,
    formats_table,
    get_format,
)
from normlab.precision.random_bits import splitmix64, stochastic_words
from normlab.precision.rounding import RoundingMode, quantize

__all__ += [
    "BFLOAT16",
    "FLOAT4_E2M1FN",
    "FLOAT6_E2M3FN",
    "FLOAT6_E3M2FN",
    "FLOAT8_E4M3FN",
    "FLOAT8_E5M2",
    "FLOAT8_E8M0FNU",
    "FLOAT16",
    "FLOAT32",
    "NAMED_FORMATS",
    "Format",
    "NanConvention",
    "RoundingMode",
    "formats_table",
    "get_format",
    "quantize",
    "splitmix64",
    "stochastic_words",
]

# --- scaling and training (owner: scaling) ---
