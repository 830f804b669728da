"""Float formats, exact rounding, loss scaling, mixed-precision training and scaled recipes.

Formats and rounding: `formats`, `rounding` (modes in `modes`), `codes`. Scaled recipes:
their settings in [normlab.precision.recipes][], their arithmetic written once against the
array namespace ([normlab.precision.namespace][]) in `scales`, `blocks`, `block_scales`
and `recipe_core`, and the public functions per-tensor FP8 (`fp8_scaling`), MX (`mx`),
NVFP4 (`nvfp4`), blockwise FP8 (`blockwise`) and the random Hadamard transform
(`hadamard`). Training: loss scaling, master weights, low-precision matmul.
"""

from __future__ import annotations

from normlab.precision.blockwise import BlockwiseTensor, blockwise_quantize
from normlab.precision.codes import (
    BitLayout,
    bit_layout,
    decode,
    encode,
    from_ml_dtypes,
    to_ml_dtypes,
)
from normlab.precision.format_table import formats_table
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
    get_format,
)
from normlab.precision.fp8_scaling import (
    Fp8Meta,
    Fp8Tensor,
    compute_scale,
    fp8_quantize,
    quantize_current_scaling,
)
from normlab.precision.hadamard import (
    hadamard_matrix,
    inverse_random_hadamard_transform,
    random_hadamard_transform,
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
from normlab.precision.modes import RoundingMode
from normlab.precision.mx import MXTensor, e8m0_scales, mx_dequantize, mx_quantize
from normlab.precision.nvfp4 import NVFP4Tensor, nvfp4_quantize
from normlab.precision.random_bits import splitmix64, stochastic_words
from normlab.precision.recipes import (
    MXINT8,
    Bf16Recipe,
    BlockwiseFp8Recipe,
    DelayedScaling,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.precision.rounding import quantize

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
    "MXINT8",
    "NAMED_FORMATS",
    "Bf16Recipe",
    "BitLayout",
    "BlockwiseFp8Recipe",
    "BlockwiseTensor",
    "DelayedScaling",
    "DynamicLossScaler",
    "Format",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "Fp8Meta",
    "Fp8RowwiseRecipe",
    "Fp8Tensor",
    "LowPrecisionUpdater",
    "MXRecipe",
    "MXTensor",
    "MasterWeights",
    "NVFP4Recipe",
    "NVFP4Tensor",
    "NanConvention",
    "RoundingMode",
    "StaticLossScaler",
    "StepResult",
    "bit_layout",
    "blockwise_quantize",
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
    "hadamard_matrix",
    "inverse_random_hadamard_transform",
    "loss_scaled_gradient",
    "lowp_matmul",
    "mixed_precision_step",
    "mx_dequantize",
    "mx_quantize",
    "nvfp4_quantize",
    "quantize",
    "quantize_current_scaling",
    "random_hadamard_transform",
    "round_to_bfloat16",
    "splitmix64",
    "stochastic_words",
    "to_ml_dtypes",
]
