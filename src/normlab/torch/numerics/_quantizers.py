"""The one place where the inspector turns a recipe into the quantizer of a GEMM operand.

Contract: [operand_quantizer][normlab.torch.numerics._quantizers.operand_quantizer] maps
(recipe, role) to an `OperandQuantizer`: a callable that fake-quantises a 2-D operand
exactly as a converted layer's forward (x, W) or dgrad (dy) GEMM does, blocks along the last
axis (the contraction axis of those GEMMs), and returns the dequantised values, the element
values and the block scales. Everything else in the inspector asks this object (its format,
its block shape, its `end_step`) and never looks at the recipe's class.

Each quantizer is built from the public quantise functions of [normlab.torch][]
(`quantize`, `quantize_current_scaling`, `fp8_quantize`, `Fp8Meta`, `mx_quantize`,
`nvfp4_quantize`, `blockwise_quantize`), which equal the training layer's operands bit for
bit. Two deliberate differences from a layer's GEMMs: NVFP4 gradients are rounded to
nearest (a layer's stochastic rounding draws from the layer's own streams, which a shadow
copy must not advance), and the random Hadamard transform of NVFP4's wgrad inputs is not
applied (the inspected operands are those of the forward and dgrad GEMMs, which it does
not touch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from normlab.precision.formats import Format
from normlab.precision.recipes import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
    check_recipe,
)
from normlab.torch._gemm import ROLES
from normlab.torch.blockwise import blockwise_quantize
from normlab.torch.mx import mx_quantize
from normlab.torch.nvfp4 import nvfp4_quantize
from normlab.torch.quantize import quantize
from normlab.torch.scaling import Fp8Meta, fp8_quantize, quantize_current_scaling

__all__ = ["OperandQuantizer", "Quantized", "operand_quantizer", "recipe_label"]

_ROLE_INDEX = {role: i for i, role in enumerate(ROLES)}  # rows of a layer's scale state


@dataclass(frozen=True)
class Quantized:
    """One operand after quantisation (all float32, on the operand's device).

    Attributes
    ----------
    values : torch.Tensor
        The dequantised operand, shape (R, C): what the GEMM multiplies.
    scales : torch.Tensor or None
        The dequantisation multipliers, one per block, shape (ceil(R / br), ceil(C / bc))
        for blocks of br x bc (the `block` of the quantizer); one value for per-tensor
        recipes; None for unscaled rounding.
    """

    values: torch.Tensor
    scales: torch.Tensor | None


def _noop() -> None:
    return None


@dataclass(frozen=True)
class OperandQuantizer:
    """Fake quantisation of one operand role under one recipe.

    Attributes
    ----------
    recipe : str
        The recipe's `repr` (a constructor call that `convert` mappings can reuse).
    fmt : Format
        The element format.
    block : tuple of int or None
        One block's (rows, columns) in the operand; None for per-tensor scaling and
        unscaled rounding.
    fn : callable
        `fn(t) -> Quantized` for a 2-D tensor `t`.
    end_step : callable
        Called once per optimizer step (delayed scaling's scale update; nothing otherwise).
    """

    recipe: str
    fmt: Format
    block: tuple[int, int] | None
    fn: Callable[[torch.Tensor], Quantized]
    end_step: Callable[[], None] = field(default=_noop)

    def __call__(self, t: torch.Tensor) -> Quantized:
        """Quantise the 2-D operand `t` (R, C)."""
        return self.fn(t)


def recipe_label(recipe: Any) -> str:
    """The label records carry for `recipe`: its `repr`, a constructor call."""
    return repr(recipe)


def operand_quantizer(recipe: Any, role: str, *, layer: Any = None) -> OperandQuantizer:
    """The quantizer of operand `role` (`"x"`, `"w"` or `"dy"`) under `recipe`.

    Parameters
    ----------
    recipe : Recipe
        A training recipe of [normlab.precision.recipes][].
    role : {"x", "w", "dy"}
        The GEMM operand: input, weight or output gradient.
    layer : QuantLinear or None, optional
        A converted layer whose state the operand uses (delayed scaling: the layer's
        current scale, read when the operand is quantised). None: the quantizer keeps its
        own state (an `Fp8Meta` per operand, updated by `end_step`).

    Returns
    -------
    quantizer : OperandQuantizer

    Raises
    ------
    TypeError
        If `recipe` is not a training recipe.
    ValueError
        If `role` is not one of "x", "w", "dy".
    """
    check_recipe(recipe)
    if role not in _ROLE_INDEX:
        raise ValueError(f"role must be one of {sorted(_ROLE_INDEX)}; got {role!r}")
    label = recipe_label(recipe)
    fmt = recipe.format_for("backward" if role == "dy" else "forward")
    r = recipe
    if isinstance(r, Bf16Recipe):
        def rounded(t: torch.Tensor) -> Quantized:
            v = quantize(t, fmt).to(torch.float32)
            return Quantized(v, None)
        return OperandQuantizer(label, fmt, None, rounded)
    if isinstance(r, Fp8CurrentRecipe):
        return OperandQuantizer(label, fmt, None, lambda t: _per_tensor(
            quantize_current_scaling(t, fmt, margin=r.margin, amax_epsilon=r.amax_epsilon,
                                     power_of_2_scales=r.power_of_2_scales)))
    if isinstance(r, Fp8DelayedRecipe):
        if layer is not None:  # the converted layer's own scale for this operand
            index = _ROLE_INDEX[role]
            return OperandQuantizer(label, fmt, None, lambda t: _per_tensor(
                fp8_quantize(t, fmt, layer.scale[index].detach().clone())))
        return _delayed(r, role, label, fmt)
    if isinstance(r, MXRecipe):
        return OperandQuantizer(label, fmt, (1, r.block_size), lambda t: _block(
            mx_quantize(t, fmt, block_size=r.block_size, axis=1, scale_rule=r.scale_rule,
                        pad=True), "mx"))
    if isinstance(r, NVFP4Recipe):
        two_d = role == "w" and r.two_d_weights
        return OperandQuantizer(label, fmt, (16, 16) if two_d else (1, 16), lambda t: _block(
            nvfp4_quantize(t, axis=1, block_shape=(16, 16) if two_d else None), "nvfp4"))
    if isinstance(r, BlockwiseFp8Recipe):
        k = r.block_size
        shape = (k, k) if role == "w" else (1, k)
        return OperandQuantizer(label, fmt, shape, lambda t: _block(blockwise_quantize(
            t, fmt, block_shape=shape, power_of_2_scales=r.power_of_2_scales,
            amax_epsilon=r.amax_epsilon), "block"))
    raise TypeError(f"recipe {recipe!r} has no operand quantizer")  # check_recipe let it by


def _per_tensor(q: Any) -> Quantized:
    inv = torch.as_tensor(q.scale_inv, dtype=torch.float32).reshape(1)
    return Quantized(q.dequantize().to(torch.float32), inv)


def _block(q: Any, family: str) -> Quantized:
    if family == "mx":
        scales = q.scales
    elif family == "nvfp4":
        scales = q.block_scales * q.tensor_scale
    else:
        scales = q.scale_inv
    return Quantized(q.dequantize().to(torch.float32), scales.to(torch.float32))


def _delayed(r: Fp8DelayedRecipe, role: str, label: str, fmt: Format) -> OperandQuantizer:
    """Delayed scaling with its own state: one `Fp8Meta`, made on the first operand's device."""
    metas: list[Fp8Meta] = []

    def quantise(t: torch.Tensor) -> Quantized:
        if not metas:
            metas.append(Fp8Meta(r, "backward" if role == "dy" else "forward", t.device))
        return _per_tensor(metas[0].quantize(t))

    def end_step() -> None:
        if metas:
            metas[0].update()

    return OperandQuantizer(label, fmt, None, quantise, end_step)
