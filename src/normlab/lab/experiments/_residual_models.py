"""Tiny Transformer stacks with every residual placement of [normlab.nn.Residual][].

Shared by [normlab.lab.experiments.residual_depth][]. A stack of N layers is 2N residual
sub-layers, causal self-attention then a ReLU MLP, each wrapped by `Residual` with the
placement's norm (LayerNorm, gain 1 and bias 0 at init), Xavier-normal weights and zero
biases, float64. Per placement:

* pre, sandwich: a final LayerNorm after the last sub-layer (GPT-2; Peri-LN);
* post, deepnorm, admin: none (the last sub-layer ends with a norm);
* deepnorm: alpha, beta = `deepnorm_constants(N)`; the MLP's, value and output
  projections' weights multiplied by beta (`deepnorm_init`);
* admin: omega (one value per feature) set by `admin_initialize` on the input batch;
* rezero: no norm at all, alpha = 0.

Shapes: B sequences, T positions, C = d model width.
"""

from __future__ import annotations

import numpy as np

from normlab.nn import (
    MLP,
    CausalSelfAttention,
    LayerNorm,
    Module,
    PreNormStack,
    Residual,
    admin_initialize,
    deepnorm_constants,
    deepnorm_init,
)

__all__ = ["PLACEMENTS", "build_stack", "stack_output"]

PLACEMENTS = ("post", "deepnorm", "admin", "pre", "sandwich", "rezero")
F64 = np.float64


def _wrap(placement: str, sub: Module, d: int, alpha: float) -> Residual:
    ln = LayerNorm(d, dtype=F64)
    if placement in ("pre", "post"):
        return Residual(sub, ln, placement)
    if placement == "deepnorm":
        return Residual(sub, ln, "deepnorm", alpha=alpha)
    if placement == "sandwich":
        return Residual(sub, ln, "sandwich", out_norm=LayerNorm(d, dtype=F64))
    if placement == "admin":
        return Residual(sub, ln, "admin", omega=np.ones(d), dtype=F64)
    return Residual(sub, None, "rezero", dtype=F64)


def build_stack(
    placement: str,
    n_layers: int,
    x: np.ndarray,
    rng: np.random.Generator,
    *,
    d_ff: int,
    n_heads: int,
) -> PreNormStack:
    """N layers (2N residual sub-layers) of the given placement for inputs like `x` (B,T,C).

    `x` is the profiling batch of Admin's initialisation (unused by other placements).
    """
    d = x.shape[-1]
    alpha, beta = deepnorm_constants(n_layers)
    residuals = []
    for _ in range(n_layers):
        attn = CausalSelfAttention(d, n_heads, rng=rng, init="xavier_normal", dtype=F64)
        mlp = MLP(d, d_ff, rng=rng, activation="relu", init="xavier_normal", dtype=F64)
        for sub in (attn, mlp):
            if placement == "deepnorm":
                deepnorm_init(sub, beta)
            residuals.append(_wrap(placement, sub, d, alpha))
    final = LayerNorm(d, dtype=F64) if placement in ("pre", "sandwich") else None
    if placement == "admin":
        admin_initialize(residuals, x)
    return PreNormStack(residuals, final)


def stack_output(stack: PreNormStack, x: np.ndarray) -> np.ndarray:
    """The stack's output F(x) (B,T,C), without keeping any cache."""
    out = stack.forward(x)
    stack.clear_cache()
    return out
