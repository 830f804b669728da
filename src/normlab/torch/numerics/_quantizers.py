"""The inspector's view of a GEMM operand: the recipe's own quantizer, with its statistics.

Contract: [operand_quantizer][normlab.torch.numerics._quantizers.operand_quantizer] maps
(recipe, role) to an `OperandQuantizer`: a callable that fake-quantises a 2-D operand
exactly as a converted layer's forward (x, W) or dgrad (dy) GEMM does, blocks along the last
axis (the contraction axis of those GEMMs), and returns the dequantised values and the
block scales. It asks the recipe for the operand's quantizer
(`recipe.quantizer(role, 1)`, `normlab.precision.scaled.quantizers`) and runs it through the
layer's own custom ops, so the inspected operand is the layer's bit for bit; nothing here
looks at a recipe's class. Per-tensor scales come from the converted layer (delayed
scaling: its current scale), from the operand's own amax (current scaling), or, in shadow
mode, from an `Fp8Meta` per operand updated once per step.

Two deliberate differences from a layer's GEMMs: NVFP4 gradients are rounded to nearest (a
layer's stochastic rounding draws from the layer's own streams, which a shadow copy must
not advance), and the random Hadamard transform of NVFP4's wgrad inputs is not applied
(the inspected operands are those of the forward and dgrad GEMMs, which it does not touch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from normlab.precision.formats.format import Format
from normlab.precision.scaled.quantizers import Quantizer
from normlab.precision.scaled.recipes import check_recipe
from normlab.torch.namespace import TORCH
from normlab.torch.scaling import Fp8Meta
from normlab.torch.training import _operand_ops as ops
from normlab.torch.training._gemm import ROLES

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
    quantizer : Quantizer
        The recipe's quantizer of the operand (blocks along axis 1).
    fn : callable
        `fn(t) -> Quantized` for a 2-D tensor `t`.
    end_step : callable
        Called once per optimizer step (delayed scaling's scale update; nothing otherwise).
    """

    recipe: str
    fmt: Format
    quantizer: Quantizer
    fn: Callable[[torch.Tensor], Quantized]
    end_step: Callable[[], None] = field(default=_noop)

    def __call__(self, t: torch.Tensor) -> Quantized:
        """Quantise the 2-D operand `t` (R, C)."""
        return self.fn(t)

    def block_of(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """One block's (rows, columns) in an operand of `shape`; None without blocks."""
        r, c = self.quantizer.block
        if (r, c) == (0, 0):
            return None
        return (r or int(shape[0]), c or int(shape[1]))


def recipe_label(recipe: Any) -> str:
    """The label records carry for `recipe`: its `repr`, a constructor call."""
    return repr(recipe)


def operand_quantizer(recipe: Any, role: str, *, layer: Any = None) -> OperandQuantizer:
    """The quantizer of operand `role` (`"x"`, `"w"` or `"dy"`) under `recipe`.

    Parameters
    ----------
    recipe : Recipe
        A training recipe of [normlab.precision.scaled.recipes][].
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
    q = recipe.quantizer(role, 1)  # forward (x, W) and dgrad (dy) contract axis 1
    if q.takes_scale and recipe.delayed and layer is None:
        return _delayed(recipe, role, label, q)
    index = _ROLE_INDEX[role]

    def scale_of(t: torch.Tensor) -> torch.Tensor | None:
        if not q.takes_scale:
            return None
        if recipe.delayed:  # the converted layer's own scale for this operand
            return layer.scale[index].detach().clone()
        amax = ops.tensor_amax(t).reshape(1).to(torch.float32)
        return recipe.scale_from_amax(amax[0], q.fmt, xp=TORCH)

    return OperandQuantizer(label, q.fmt, q, lambda t: _run(q, t, scale_of(t)))


def _run(q: Quantizer, t: torch.Tensor, scale: torch.Tensor | None) -> Quantized:
    """The layer's operand `q(t)` and its block multipliers (from the encoded scales):
    values and codes from one pass where the quantizer allows (`fake_encode`, as a
    layer's forward quantises its input; otherwise its two passes)."""
    if not q.has_scales:
        return Quantized(ops.fake(t, q, scale=scale), None)
    values, (codes, scales, tensor_scale) = ops.fake_encode(t, q, scale=scale)
    mult = q.multipliers(q.encoded(codes, scales, tensor_scale), TORCH)
    return Quantized(values, mult.to(torch.float32))


def _delayed(r: Any, role: str, label: str, q: Quantizer) -> OperandQuantizer:
    """Delayed scaling with its own state: one `Fp8Meta`, made on the first operand's device."""
    metas: list[Fp8Meta] = []

    def quantise(t: torch.Tensor) -> Quantized:
        if not metas:
            metas.append(Fp8Meta(r, "backward" if role == "dy" else "forward", t.device))
        return _run(q, t, metas[0].quantize(t).scale)

    def end_step() -> None:
        if metas:
            metas[0].update()

    return OperandQuantizer(label, q.fmt, q, quantise, end_step)
