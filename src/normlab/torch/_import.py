"""Import PyTorch for `normlab.torch` or fail with the install line.

Contract: every module of `normlab.torch` gets torch from here, so a missing install
raises one ImportError that says how to fix it. The core package never imports this.
"""

from __future__ import annotations

__all__ = ["INSTALL_HINT", "torch"]

INSTALL_HINT = 'normlab.torch needs PyTorch >= 2.3: pip install ".[torch]"'

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(f"{INSTALL_HINT} (import torch failed: {exc})") from exc
