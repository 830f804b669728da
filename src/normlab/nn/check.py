"""Gradient-check a whole module: its input and every parameter, with [normlab.gradcheck][].

Contract: the module is evaluated as the pure function `(x, *parameter values) -> out`
in float64. Between evaluations every generator held by a sub-module (Dropout's `rng`) is
rewound and every buffer (running statistics) is restored, so the function is
deterministic; at the end the parameters get their original arrays back and their gradients
are cleared.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from normlab._validate import check_generator
from normlab.gradcheck import gradcheck
from normlab.nn.module import Module

__all__ = ["module_gradcheck"]


def module_gradcheck(
    module: Module,
    x: Any,
    *,
    rng: np.random.Generator,
    params: bool | Sequence[str] = True,
    mode: str = "full",
    num_directions: int = 4,
    h: float = 1e-6,
    tol: float | None = None,
) -> float:
    """Largest relative error of `module.backward` against central differences.

    Checks d L / d x (unless x is an integer array, e.g. token ids) and d L / d p for the
    selected parameters, where L = <dout, module(x)> with a random dout.

    Parameters
    ----------
    module : Module
        Used in its current train/eval mode.
    x : array
        The input (float inputs are checked as float64).
    rng : numpy.random.Generator
        Draws dout and the directions.
    params : bool or sequence of str
        True: every parameter; False: none; or the dotted names to check.
    mode, num_directions, h, tol
        As [normlab.gradcheck][] (`"directional"` for big models).

    Returns
    -------
    float
        The maximum relative error over x and the parameters.

    Raises
    ------
    normlab.GradcheckError
        When `tol` is given and exceeded.

    ValueError
        On an unknown parameter name.

    Examples
    --------
    >>> from normlab.nn import LayerNorm
    >>> err = module_gradcheck(LayerNorm(3, dtype=np.float64), np.random.default_rng(0)
    ...                        .normal(size=(2, 3)), rng=np.random.default_rng(1))
    >>> err < 1e-6
    True
    """
    check_generator(rng)
    named = list(module.named_parameters())
    if params is True:
        chosen = named
    elif params is False:
        chosen = []
    else:
        known = dict(named)
        unknown = [n for n in params if n not in known]
        if unknown:
            raise ValueError(f"params must name parameters of the module {list(known)}; "
                             f"got unknown {unknown}")
        chosen = [(n, known[n]) for n in params]
    originals = [p.data for _, p in chosen]
    generators = [
        (m, copy.deepcopy(m.__dict__["rng"]))
        for _, m in module.named_modules()
        if isinstance(m.__dict__.get("rng"), np.random.Generator)
    ]
    buffers = [b for _, b in module.named_buffers()]

    def forward(xv: Any, *values: np.ndarray) -> tuple[Any, None]:
        for m, g in generators:
            m.__dict__["rng"].bit_generator.state = g.bit_generator.state
        for (_, p), v in zip(chosen, values, strict=True):
            p.data = v
        return module.forward(xv), None

    def backward(dout: np.ndarray, _: None) -> tuple[Any, ...]:
        module.zero_grad()
        dx = module.backward(dout)
        return (dx, *[p.grad for _, p in chosen])

    is_int = np.issubdtype(np.asarray(x).dtype, np.integer)
    names = ["x"] + [n for n, _ in chosen]
    wrt = list(range(1 if is_int else 0, len(names)))
    try:
        return gradcheck(
            forward, backward, [np.asarray(x), *originals], rng=rng, wrt=wrt, mode=mode,
            num_directions=num_directions, h=h, tol=tol, names=names, state=buffers,
        )
    finally:
        for (_, p), data in zip(chosen, originals, strict=True):
            p.data = data
        module.zero_grad()
