"""Switch the recipes of converted layers off in a region: evaluation in high precision.

Contract: inside `with no_quantization():` every
[QuantLinear][normlab.torch.training.linear.QuantLinear] (and
[QuantConv1D][normlab.torch.training.conv1d.QuantConv1D]) computes exactly what the layer it
replaced computes (`torch.nn.functional.linear`, or Hugging Face `Conv1D`'s `addmm`) and
changes no recipe state: no amax is recorded, no scale is updated, no stochastic-rounding
counter advances. This is the role of Transformer Engine's `fp8_autocast(enabled=False)`.
The switch is process-wide (as Transformer Engine's), not per thread; it nests, and the
previous setting comes back on exit, also when the body raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["no_quantization", "quantization_enabled"]

_enabled = True  # read by every QuantLinear forward


def quantization_enabled() -> bool:
    """Whether converted layers quantise now.

    Returns
    -------
    enabled : bool
        False inside a [no_quantization][normlab.torch.training.switch.no_quantization] region,
        True outside every one.
    """
    return _enabled


@contextlib.contextmanager
def no_quantization() -> Iterator[None]:
    """Run the body with every converted layer computing in its parameters' precision.

    Usable as a context manager or a decorator. Inside, a
    [QuantLinear][normlab.torch.training.linear.QuantLinear] is `torch.nn.Linear` bit for bit and
    records no amaxes, so evaluating a model leaves its delayed-scaling state as training
    left it.

    Examples
    --------
    >>> import torch
    >>> from normlab.torch import Fp8CurrentRecipe, QuantLinear, no_quantization
    >>> layer = QuantLinear(4, 2, recipe=Fp8CurrentRecipe())
    >>> x = torch.randn(3, 4)
    >>> with no_quantization():
    ...     y = layer(x)
    >>> torch.equal(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    True
    """
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous
