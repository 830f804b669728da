"""Composition: `Sequential`, `PreNormStack` (and `Residual`, defined in
[normlab.nn.residual][] and re-exported here).

Contract: containers own no arithmetic; backward runs the children's backward in reverse
order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from normlab.nn._grad import input_grad
from normlab.nn.module import Module
from normlab.nn.residual import Residual

__all__ = ["PreNormStack", "Residual", "Sequential", "input_grad"]


class Sequential(Module):
    """Apply modules in order; backward in reverse order.

    Children are registered as `"0"`, `"1"`, ... (so parameter names read `0.weight`).

    Raises
    ------
    TypeError
        When an argument is not a Module.

    Examples
    --------
    >>> from normlab.nn import Linear, ReLU
    >>> rng = np.random.default_rng(0)
    >>> net = Sequential(Linear(4, 8, rng=rng), ReLU(), Linear(8, 2, rng=rng))
    >>> net(np.ones((3, 4), dtype=np.float32)).shape
    (3, 2)
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m.forward(x)
        return x

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        mods = list(self._modules.values())
        for m in reversed(mods[1:]):
            dout = input_grad(m, dout)
        return mods[0].backward(dout) if mods else dout


class PreNormStack(Module):
    """A stack of pre-norm blocks followed by the final norm before the output head.

    y = FinalNorm(Block_L(...Block_1(x))). Pre-norm leaves the residual stream itself
    unnormalised, so its scale grows with depth; the final norm brings it back (GPT-2,
    Xiong et al. 2020). With `final_norm=None` it is a plain [Sequential][normlab.nn.Sequential].

    Parameters
    ----------
    blocks : sequence of Module
        Registered as `blocks.0`, `blocks.1`, ...
    final_norm
        Module or None

    Attributes
    ----------
    blocks : Sequential
        The blocks, applied in order.
    final_norm : Module or None
        The norm after the last block (pre-norm models), or None.

    Examples
    --------
    >>> from normlab.nn import LayerNorm, Linear
    >>> rng = np.random.default_rng(0)
    >>> blocks = [Residual(Linear(4, 4, rng=rng), LayerNorm(4), "pre") for _ in range(2)]
    >>> PreNormStack(blocks, LayerNorm(4))(np.ones((1, 4), dtype=np.float32)).shape
    (1, 4)
    """

    def __init__(self, blocks: Sequence[Module], final_norm: Module | None) -> None:
        super().__init__()
        if final_norm is not None and not isinstance(final_norm, Module):
            raise TypeError(f"final_norm must be a normlab.nn.Module or None; got {final_norm!r}")
        self.blocks = Sequential(*blocks)
        self.final_norm = final_norm

    def forward(self, x: Any) -> Any:
        h = self.blocks.forward(x)
        return h if self.final_norm is None else self.final_norm.forward(h)

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        if self.final_norm is not None:
            dout = input_grad(self.final_norm, dout)
        return self.blocks.backward(dout)
