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

# ruff: noqa: F403  (star imports of modules with an explicit __all__, re-exported)
from __future__ import annotations

from normlab._moved import keep_old_paths
from normlab.lab import listings
from normlab.lab.listings import *
from normlab.precision import formats, scaled, training
from normlab.precision.formats import *
from normlab.precision.scaled import *
from normlab.precision.training import *

__all__ = []
__all__ += formats.__all__
__all__ += scaled.__all__
__all__ += training.__all__
__all__ += listings.__all__

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
        "matmul": "normlab.precision.training.matmul",
        "listings": "normlab.lab.listings",
    },
)
