"""Inverted dropout as a layer: [Dropout][normlab.nn.Dropout] (Srivastava et al. 2014).

Contract: in training mode the layer composes
[normlab.dropout.inverted_dropout][normlab.inverted_dropout] (Listing 16.3) with the generator
it was given; in evaluation mode, or with `p == 0`, it is the identity and draws no random
numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_generator, check_probability
from normlab.dropout import inverted_dropout, inverted_dropout_backward
from normlab.nn.module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    """Zero each activation with probability p and scale the survivors by 1/(1 - p).

    out = m * x / (1 - p),  m_i ~ Bernoulli(1 - p),  so E[out] = x; identity in eval mode.

    Parameters
    ----------
    p : float
        Drop probability in [0, 1) (normlab's convention, see DESIGN.md).
    rng : numpy.random.Generator
        Source of the masks (advanced at every training forward with p > 0).

    Raises
    ------
    ValueError
        When p lies outside [0, 1) or is NaN.
    TypeError
        When rng is not a numpy Generator.

    Examples
    --------
    >>> drop = Dropout(0.5, np.random.default_rng(0)).eval()
    >>> drop(np.ones(3))
    array([1., 1., 1.])
    """

    def __init__(self, p: float, rng: np.random.Generator) -> None:
        super().__init__()
        self.p = check_probability(p, "p")
        self.rng = check_generator(rng)

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        if not self.training or self.p == 0.0:
            self._save((None,))
            return x
        out, keep = inverted_dropout(x, self.p, self.rng)
        self._save((keep,))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        (keep,) = self._take()
        if keep is None:
            return np.asarray(dout)
        return inverted_dropout_backward(np.asarray(dout), keep, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
