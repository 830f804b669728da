"""Float formats, exact rounding, loss scaling, mixed-precision training and scaled recipes.

Four subpackages, one concern each:

* `normlab.precision.formats`: binary float formats as data, their bit codes, exact
  rounding to any format (deterministic and stochastic);
* `normlab.precision.scaled`: the scaled recipes (FP8 per tensor, per row and per block,
  MX, NVFP4) as frozen settings, their quantizers (one per scaling family) and public
  functions, and the scale arithmetic written once for NumPy and torch;
* `normlab.precision.operands`: a training GEMM's operand under its quantizer, fake-quantised
  or saved as codes;
* `normlab.precision.training`: the chapter's mixed-precision training: loss scaling,
  fp32 master weights, the guarded step, low-precision updates and matmul.

The chapter's Listing 16.4 lives beside the lab (`normlab.lab.listings`). Every public name
is importable from this package. The modules that used to sit directly in it (before the
layout by concern) keep their old dotted paths: `normlab.precision.recipes`,
`normlab.precision.mx` and the others are the moved modules themselves.
"""

from __future__ import annotations

from normlab._moved import keep_old_paths
from normlab.lab.listings import (
    fp16_overflows_but_bfloat16_keeps_range,
    loss_scaled_gradient,
    round_to_bfloat16,
)
from normlab.precision.formats.codes import (
    BitLayout,
    bit_layout,
    decode,
    encode,
    from_ml_dtypes,
    to_ml_dtypes,
)
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
from normlab.precision.formats.modes import RoundingMode
from normlab.precision.formats.random_bits import splitmix64, stochastic_words
from normlab.precision.formats.rounding import quantize
from normlab.precision.formats.table import formats_table
from normlab.precision.scaled.blockwise import BlockwiseTensor, blockwise_quantize
from normlab.precision.scaled.fp8_scaling import (
    Fp8Meta,
    Fp8Tensor,
    compute_scale,
    fp8_quantize,
    quantize_current_scaling,
)
from normlab.precision.scaled.hadamard import (
    hadamard_matrix,
    inverse_random_hadamard_transform,
    random_hadamard_transform,
)
from normlab.precision.scaled.mx import MXTensor, e8m0_scales, mx_dequantize, mx_quantize
from normlab.precision.scaled.nvfp4 import NVFP4Tensor, nvfp4_quantize
from normlab.precision.scaled.recipes import (
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
from normlab.precision.training.loss_scaling import DynamicLossScaler, StaticLossScaler
from normlab.precision.training.lowp_matmul import lowp_matmul
from normlab.precision.training.lowp_update import LowPrecisionUpdater
from normlab.precision.training.master_weights import MasterWeights
from normlab.precision.training.mixed_step import StepResult, clip_grad_norm, mixed_precision_step

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


# The modules' paths before the layout by concern (a module per file directly in this
# package): each old path names the moved module itself.
keep_old_paths(
    __name__,
    {
        "codes": "normlab.precision.formats.codes",
        "rounding": "normlab.precision.formats.rounding",
        "modes": "normlab.precision.formats.modes",
        "_round_scalar": "normlab.precision.formats._round_scalar",
        "random_bits": "normlab.precision.formats.random_bits",
        "format_table": "normlab.precision.formats.table",
        "recipes": "normlab.precision.scaled.recipes",
        "recipe_base": "normlab.precision.scaled.recipe",
        "recipe_fp8": "normlab.precision.scaled.fp8_recipes",
        "recipe_formats": "normlab.precision.scaled.recipe_formats",
        "quantizer_base": "normlab.precision.scaled.quantizer",
        "quantizers": "normlab.precision.scaled.quantizers",
        "microscaling": "normlab.precision.scaled.microscaling",
        "fp8_scaling": "normlab.precision.scaled.fp8_scaling",
        "mx": "normlab.precision.scaled.mx",
        "nvfp4": "normlab.precision.scaled.nvfp4",
        "blockwise": "normlab.precision.scaled.blockwise",
        "hadamard": "normlab.precision.scaled.hadamard",
        "scales": "normlab.precision.scaled.scales",
        "blocks": "normlab.precision.scaled.tiling",
        "block_scales": "normlab.precision.scaled.block_scales",
        "recipe_core": "normlab.precision.scaled.arithmetic",
        "namespace": "normlab.precision.scaled.namespace",
        "operand_codes": "normlab.precision.operands.codes",
        "operand_pass": "normlab.precision.operands.one_pass",
        "loss_scaling": "normlab.precision.training.loss_scaling",
        "_scaler_ops": "normlab.precision.training._scaler_ops",
        "master_weights": "normlab.precision.training.master_weights",
        "mixed": "normlab.precision.training.mixed_step",
        "lowp_update": "normlab.precision.training.lowp_update",
        "matmul": "normlab.precision.training.lowp_matmul",
        "listings": "normlab.lab.listings",
    },
)
