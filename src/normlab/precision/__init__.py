"""Float formats, exact rounding, loss scaling, mixed-precision training, fp8 and MX scaling."""

from __future__ import annotations

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
from normlab.precision.fp8_scaling import (
    DelayedScaling,
    Fp8Meta,
    Fp8Tensor,
    compute_scale,
    fp8_quantize,
    quantize_current_scaling,
)
from normlab.precision.listings import (
    fp16_overflows_but_bfloat16_keeps_range,
    loss_scaled_gradient,
    round_to_bfloat16,
)
from normlab.precision.loss_scaling import DynamicLossScaler, StaticLossScaler
from normlab.precision.lowp_update import LowPrecisionUpdater
from normlab.precision.master_weights import MasterWeights
from normlab.precision.matmul import lowp_matmul
from normlab.precision.mixed import StepResult, clip_grad_norm, mixed_precision_step
from normlab.precision.mx import (
    MXTensor,
    e8m0_scales,
    mx_dequantize,
    mx_quantize,
)
from normlab.precision.random_bits import splitmix64, stochastic_words
from normlab.precision.rounding import RoundingMode, quantize

__all__ = [
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
    "BitLayout",
    "DelayedScaling",
    "DynamicLossScaler",
    "Format",
    "Fp8Meta",
    "Fp8Tensor",
    "LowPrecisionUpdater",
    "MXTensor",
    "MasterWeights",
    "NanConvention",
    "RoundingMode",
    "StaticLossScaler",
    "StepResult",
    "bit_layout",
    "clip_grad_norm",
    "compute_scale",
    "decode",
    "e8m0_scales",
    "encode",
    "formats_table",
    "fp8_quantize",
    "fp16_overflows_but_bfloat16_keeps_range",
    "from_ml_dtypes",
    "get_format",
    "loss_scaled_gradient",
    "lowp_matmul",
    "mixed_precision_step",
    "mx_dequantize",
    "mx_quantize",
    "quantize",
    "quantize_current_scaling",
    "round_to_bfloat16",
    "splitmix64",
    "stochastic_words",
    "to_ml_dtypes",
]
