"""The training recipes of `QuantLinear`, re-exported from [normlab.precision.scaled.recipes][].

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

from normlab.precision.scaled.recipes import *  # noqa: F403  (the same classes, not copies)
from normlab.precision.scaled.recipes import __all__  # noqa: F401
