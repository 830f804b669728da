"""Initialisations that belong to residual placements: DeepNorm's alpha and beta, Admin's omega.

Contract: these functions only write parameter values (`Parameter.data`); they never change a
module's structure. [admin_initialize][normlab.nn.admin_initialize] runs one profiling forward
pass and clears the caches it leaves behind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int, check_positive
from normlab.nn.linear import Linear
from normlab.nn.module import Module
from normlab.nn.residual import Residual

__all__ = ["admin_initialize", "deepnorm_constants", "deepnorm_init"]


def deepnorm_constants(n_layers: int, architecture: str = "decoder") -> tuple[float, float]:
    r"""DeepNorm's skip scale alpha and weight scale beta for an N-layer encoder or decoder.

    $$
    \alpha = (2N)^{1/4}, \qquad \beta = (8N)^{-1/4}
    $$

    for encoder-only (BERT-like) and decoder-only (GPT-like) models (Wang et al. 2022,
    "DeepNet: Scaling Transformers to 1,000 Layers", the table of alpha and beta beside their
    DeepNorm pseudocode; N counts Transformer layers, each holding an attention and an FFN
    sub-layer). The encoder-decoder constants of the same table are not provided here.

    Parameters
    ----------
    n_layers : int
        N >= 1.
    architecture : {"decoder", "encoder"}
        The two give the same constants; the name documents the model.

    Returns
    -------
    alpha : float
        The skip scale, `x * alpha + F(x)`.
    beta : float
        The init gain of the branch's value and output projections and FFN weights.


    Raises
    ------
    ValueError, TypeError
        On N < 1, a non-integer N, or another architecture.

    Examples
    --------
    >>> a, b = deepnorm_constants(8); round(a, 4), round(b, 4)
    (2.0, 0.3536)
    """
    n = check_int(n_layers, "n_layers", minimum=1)
    if architecture not in ("decoder", "encoder"):
        raise ValueError(
            f"architecture must be 'decoder' or 'encoder' (encoder-decoder constants are not "
            f"provided); got {architecture!r}"
        )
    return (2.0 * n) ** 0.25, (8.0 * n) ** -0.25


def deepnorm_init(
    module: Module, beta: float, *, exclude: Sequence[str] = ("query", "key")
) -> list[str]:
    """Multiply the weight of every [Linear][normlab.nn.Linear] inside `module` by `beta`.

    DeepNet scales the (Xavier) initial weights of the FFN and of the value and output
    projections by beta and leaves the query and key projections alone; `exclude` names
    the Linear sub-modules to skip by their own attribute name (`query`, `key` of
    [CausalSelfAttention][normlab.nn.CausalSelfAttention]). Biases are left as they are.

    Parameters
    ----------
    module
        Module
    beta : float
        The scale (> 0), e.g. the second value of
        [deepnorm_constants][normlab.nn.deepnorm_constants].
    exclude
        Sequence of str

    Returns
    -------
    list of str
        Dotted names of the scaled weights.

    Raises
    ------
    ValueError, TypeError
        On a non-Module or a beta that is not a finite number > 0.

    Examples
    --------
    >>> lin = Linear(2, 2, rng=np.random.default_rng(0))
    >>> w = lin.weight.data.copy(); deepnorm_init(lin, 0.5)
    ['weight']
    >>> bool(np.all(lin.weight.data == w * np.float32(0.5)))
    True
    """
    if not isinstance(module, Module):
        raise TypeError(f"module must be a normlab.nn.Module; got {module!r}")
    b = check_positive(beta, "beta")
    scaled = []
    for name, mod in module.named_modules():
        if isinstance(mod, Linear) and name.rsplit(".", 1)[-1] not in exclude:
            w = mod.weight
            w.data = (w.data * b).astype(w.data.dtype)
            scaled.append(f"{name}.weight" if name else "weight")
    return scaled


def admin_initialize(blocks: Sequence[Residual], x: Any) -> np.ndarray:
    r"""Set each Admin block's omega from the output variances of the blocks below it.

    Admin (Liu et al. 2020, "Understanding the Difficulty of Training Transformers", the
    Admin initialisation and its profiling step) uses x_i = N(omega_i * x_{i-1} + F_i(x_{i-1})) with

    $$
    \omega_i = \sqrt{\textstyle\sum_{j<i} \operatorname{Var}[F_j(x_{j-1})]},
    $$

    the variances measured on one forward pass at initialisation. Here the input counts as
    the term j = 0, `Var[x_0]`: without it omega_1 would be 0 and cut the first skip path.
    Every element of omega_i gets the same value (its shape is kept).

    Parameters
    ----------
    blocks : sequence of Residual
        Applied one after another (x_i = blocks[i-1](x_{i-1})), all with placement "admin".
    x : array
        A profiling batch x_0 (..., C).

    Returns
    -------
    numpy.ndarray
        (len(blocks) + 1,) float64: Var[x_0] followed by Var[F_i(x_{i-1})] for each block.

    Raises
    ------
    TypeError, ValueError
        On a block that is not an Admin Residual.

    Examples
    --------
    >>> from normlab.nn import LayerNorm
    >>> rng = np.random.default_rng(0)
    >>> blocks = [Residual(Linear(4, 4, rng=rng), LayerNorm(4), "admin") for _ in range(3)]
    >>> v = admin_initialize(blocks, rng.standard_normal((64, 4)))
    >>> bool(np.isclose(blocks[2].omega.data, np.sqrt(v[:3].sum()), rtol=1e-6))
    True
    """
    for i, blk in enumerate(blocks):
        if not isinstance(blk, Residual) or blk.placement != "admin":
            raise TypeError(f"blocks[{i}] must be a Residual with placement 'admin'; got {blk!r}")
    h = as_float_array(x, "x", min_ndim=1)
    variances = [float(np.var(h.astype(np.float64)))]
    for blk in blocks:
        omega = blk.omega
        omega.data = np.full(omega.shape, math.sqrt(sum(variances)), dtype=omega.data.dtype)
        f = blk.sublayer.forward(h)  # F_i(x_{i-1}) with the block's own sub-layer
        variances.append(float(np.var(np.asarray(f, dtype=np.float64))))
        h = blk.forward(h)
        blk.clear_cache()
    return np.array(variances)
