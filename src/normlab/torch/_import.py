"""Import PyTorch for `normlab.torch` or fail with the install line.

Contract: every module of `normlab.torch` gets torch from here, so a missing install
raises one ImportError that says how to fix it. The core package never imports this.
"""

from __future__ import annotations

__all__ = ["INSTALL_HINT", "MIN_TORCH", "torch"]

import re

MIN_TORCH = (2, 13)
"""The oldest PyTorch (major, minor) that `normlab.torch` is tested with (the `torch` extra's
lower bound). Older releases run the eager paths but crash or break the graph under
`torch.compile` (2.10) and lack `torch.float4_e2m1fn_x2` (2.7)."""

INSTALL_HINT = (f"normlab.torch needs PyTorch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}: "
                'pip install ".[torch]"')

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(f"{INSTALL_HINT} (import torch failed: {exc})") from exc

_found = re.match(r"(\d+)\.(\d+)", torch.__version__)
if _found is None or (int(_found.group(1)), int(_found.group(2))) < MIN_TORCH:
    raise ImportError(f"{INSTALL_HINT} (found torch {torch.__version__})")
