"""The training recipes of `QuantLinear`, re-exported from [normlab.precision.recipes][].

The recipes are framework-neutral settings and live in `normlab.precision` (one place for
NumPy, torch and the training layer); this module keeps the import path
`normlab.torch.recipes` working.

Examples
--------
>>> Fp8DelayedRecipe().format_for("backward").name
'float8_e5m2'
>>> NVFP4Recipe(hadamard=False).hadamard
False
"""

from __future__ import annotations

from normlab.precision.recipes import (
    RECIPES,
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
    Recipe,
    check_recipe,
)

__all__ = [
    "RECIPES",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "MXRecipe",
    "NVFP4Recipe",
    "Recipe",
    "check_recipe",
]
