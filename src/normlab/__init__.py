"""normlab: normalization, residual streams, dropout and low-precision arithmetic.

The functional core (`*_forward` / `*_backward` pairs) is re-exported here; layers live
in [normlab.nn][], float formats and mixed precision in [normlab.precision][],
checkpoint files in [normlab.checkpoint][] (`normlab.checkpoint.save/load`).
`normlab.gradcheck` is the finite-difference checker: the module
[normlab.gradcheck][] (`import normlab.gradcheck as m` gives it, with `m.gradcheck`
and `m.GradcheckError`), itself callable as its function, so `normlab.gradcheck(...)`
and `from normlab import gradcheck; gradcheck(...)` run the check.
"""

# ruff: noqa: F403  (a star import of normlab.norms, whose __all__ is re-exported)
from __future__ import annotations

from typing import TYPE_CHECKING

from normlab import checkpoint, norms
from normlab._backend import KernelFallbackWarning
from normlab.dropout import inverted_dropout, inverted_dropout_backward
from normlab.gradcheck import GradcheckError
from normlab.norms import *

if TYPE_CHECKING:  # type checkers see the function (same signature as the call below)
    from normlab.gradcheck import gradcheck
else:  # the module, callable as its function (see normlab/gradcheck.py)
    from normlab import gradcheck

__version__ = "0.1.0"
"""The version of normlab (the package metadata reads it from here)."""

__all__ = [
    "GradcheckError",
    "KernelFallbackWarning",
    "__version__",
    "checkpoint",
    "gradcheck",
    "inverted_dropout",
    "inverted_dropout_backward",
]
__all__ += norms.__all__  # the functional pairs and their caches
