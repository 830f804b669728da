"""`torch.autocast` for converted layers: operands cast as `torch.nn.Linear`'s are.

Contract: inside a `torch.autocast(device_type, dtype=...)` region, `torch.nn.Linear`
casts its input, weight and bias to the autocast dtype (every floating tensor but
float64), multiplies in that dtype and returns it. A converted layer does the same with
its recipe: `autocast_operands` casts the operands (autograd casts the gradients back to
the parameters' dtype), the recipe quantises those values, and `autocast_region` turns
autocast off around the layer's own float32 arithmetic, which must not be cast again;
the result comes back in the autocast dtype, the dtype of the cast input. Outside
autocast both are no-ops.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["autocast_operands", "autocast_region"]


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if t is None or not t.is_floating_point() or t.dtype == torch.float64:
        return t  # autocast leaves float64 (and non-float) tensors alone
    return t.to(dtype)


def autocast_operands(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`(x, w, b)` cast to the autocast dtype of `x`'s device when autocast is on there."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return x, w, b
    dtype = torch.get_autocast_dtype(device)
    return _cast(x, dtype), _cast(w, dtype), _cast(b, dtype)  # type: ignore[return-value]


def autocast_region(x: torch.Tensor) -> Any:
    """A context with autocast off on `x`'s device (a no-op context when it is off)."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return contextlib.nullcontext()
    return torch.autocast(device, enabled=False)
