"""The gain and bias of a normalisation layer: created, cast and given their gradients once.

Contract: a normalisation layer of [normlab.nn][] holds an optional gain `weight` (ones) and
an optional `bias` (zeros) of the shape it normalises over, passes them to its functional
pair cast to the input's compute dtype, and accumulates the functional backward's
`(dgamma, dbeta)` into them. `None` stands for a parameter the layer does not have; the
functional pairs return `None` gradients for those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from normlab.nn.module import Module, Parameter

__all__: list[str] = []  # private helpers of the layers in normalization.py and batchnorm.py


def affine_parameters(
    shape: int | tuple[int, ...], dtype: Any, *, weight: bool, bias: bool
) -> tuple[Parameter | None, Parameter | None]:
    """A gain of ones (when `weight`) and a bias of zeros (when `weight` and `bias`)."""
    if not weight:
        return None, None
    gain = Parameter(np.ones(shape, dtype=dtype))
    return gain, Parameter(np.zeros(shape, dtype=dtype)) if bias else None


def cast(p: Parameter | None, dt: np.dtype) -> np.ndarray | None:
    """`p`'s data in the compute dtype `dt` (no copy when it already is), or None."""
    return None if p is None else p.data.astype(dt, copy=False)


def accumulate(p: Parameter | None, g: np.ndarray | None) -> None:
    """Add the gradient `g` to `p` when both exist."""
    if p is not None and g is not None:
        p.accumulate(g)


def affine_backward(
    module: Module, backward: Callable[[np.ndarray, Any], tuple[Any, Any, Any]],
    dout: np.ndarray,
) -> np.ndarray:
    """`module`'s backward through a functional `backward(dout, cache) -> (dx, dgamma,
    dbeta)`: the gradients go to `module.weight` and `module.bias`; returns dx."""
    (cache,) = module._take()
    dx, dgamma, dbeta = backward(dout, cache)
    accumulate(module.weight, dgamma)
    accumulate(module.bias, dbeta)
    return dx
