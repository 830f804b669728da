"""Scaled recipes and their quantizers: FP8 (per tensor, per row, per block), MX, NVFP4.

* `recipes`: every training recipe as frozen settings (`recipe.py` is their base, with the
  one mapping from a GEMM operand to its quantizer; the FP8 recipes in `fp8_recipes.py`);
* `quantizers`: one immutable quantizer per scaling family (`quantizer.py` is their base;
  the MX and NVFP4 quantizers in `microscaling.py`);
* the public functions per family: `fp8_scaling` (per tensor, delayed and current),
  `mx`, `nvfp4`, `blockwise`, and the random Hadamard transform (`hadamard`);
* the arithmetic they share, written once against the array namespace (`namespace`) for
  NumPy and torch alike: `scales` (per-tensor scales, the delayed update), `tiling`
  (blocks and padding), `block_scales` (the block-scale rules), `arithmetic` (each
  recipe's quantise and dequantise steps).
"""

from __future__ import annotations

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
from normlab.precision.scaled.quantizers import (
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    IdentityQuantizer,
    MXQuantizer,
    NVFP4Quantizer,
    Quantizer,
    RoundQuantizer,
)
from normlab.precision.scaled.recipes import (
    MXINT8,
    RECIPES,
    Bf16Recipe,
    BlockwiseFp8Recipe,
    DelayedScaling,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
    Recipe,
    check_recipe,
)

__all__ = [
    "MXINT8",
    "RECIPES",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "BlockwiseTensor",
    "DelayedScaling",
    "Fp8BlockQuantizer",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "Fp8Meta",
    "Fp8RowwiseRecipe",
    "Fp8Tensor",
    "Fp8TensorQuantizer",
    "IdentityQuantizer",
    "MXQuantizer",
    "MXRecipe",
    "MXTensor",
    "NVFP4Quantizer",
    "NVFP4Recipe",
    "NVFP4Tensor",
    "Quantizer",
    "Recipe",
    "RoundQuantizer",
    "blockwise_quantize",
    "check_recipe",
    "compute_scale",
    "e8m0_scales",
    "fp8_quantize",
    "hadamard_matrix",
    "inverse_random_hadamard_transform",
    "mx_dequantize",
    "mx_quantize",
    "nvfp4_quantize",
    "quantize_current_scaling",
    "random_hadamard_transform",
]
