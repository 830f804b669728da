"""Float formats, exact rounding, loss scaling, mixed-precision training, fp8 and MX scaling."""

from __future__ import annotations

__all__: list[str] = []

# --- formats, rounding, codes, chapter listings (owner: formats) ---
from normlab.precision.codes import (
    BitLayout,
    bit_layout,
    decode,
    encode,
    from_ml_dtypes,
    to_ml_dtypes,
)
from normlab.precision.formats import (
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
    formats_table,
    get_format,
)
from normlab.precision.listings import (
    fp16_overflows_but_bfloat16_keeps_range,
    loss_scaled_gradient,
    round_to_bfloat16,
)
from normlab.precision.random_bits import splitmix64, stochastic_words
from normlab.precision.rounding import RoundingMode, quantize

__all__ += [
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
    "fp16_overflows_but_bfloat16_keeps_range",
    "from_ml_dtypes",
    "get_format",
    "loss_scaled_gradient",
    "quantize",
    "round_to_bfloat16",
    "splitmix64",
    "stochastic_words",
    "to_ml_dtypes",
]

# --- scaling and training (owner: scaling) ---
from normlab.precision.fp8_scaling import (  # noqa: E402  (after the formats block)
    DelayedScaling,
    Fp8Meta,
    Fp8Tensor,
    compute_scale,
    fp8_quantize,
    quantize_current_scaling,
)
from normlab.precision.loss_scaling import DynamicLossScaler, StaticLossScaler  # noqa: E402
from normlab.precision.matmul import lowp_matmul  # noqa: E402
from normlab.precision.mixed import (  # noqa: E402
    LowPrecisionUpdater,
    MasterWeights,
    StepResult,
    clip_grad_norm,
    mixed_precision_step,
)
from normlab.precision.mx import (  # noqa: E402
    MXTensor,
    e8m0_scales,
    mx_dequantize,
    mx_quantize,
)

__all__ += [
    "DelayedScaling",
    "DynamicLossScaler",
    "Fp8Meta",
    "Fp8Tensor",
    "LowPrecisionUpdater",
    "MXTensor",
    "MasterWeights",
    "StaticLossScaler",
    "StepResult",
    "clip_grad_norm",
    "compute_scale",
    "e8m0_scales",
    "fp8_quantize",
    "lowp_matmul",
    "mixed_precision_step",
    "mx_dequantize",
    "mx_quantize",
    "quantize_current_scaling",
]
