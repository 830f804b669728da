"""The input gradient of a module, for containers that chain backwards."""

from __future__ import annotations

import numpy as np

from normlab.nn.module import Module

__all__ = ["input_grad"]


def input_grad(module: Module, dout: np.ndarray) -> np.ndarray:
    """`module.backward(dout)`, which must be an array (not None as for Embedding)."""
    dx = module.backward(dout)
    if dx is None:
        raise TypeError(
            f"{type(module).__name__} returns no input gradient (integer input?) and cannot "
            "be followed by another layer's backward"
        )
    return dx
