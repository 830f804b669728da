r"""A training GEMM's operand under a recipe: fake-quantised, or encoded as codes plus scales.

Dimension letters: R, C the operand's rows and columns; one block covers r x c of them
(`OperandSpec.block`).

A linear layer's three GEMMs each multiply two quantised operands
([normlab.precision.recipes][] has the table).
[fake_operand][normlab.precision.operands.fake_operand] gives the float32 values such a
GEMM multiplies (`dequantize(quantize(x))`);
[encode_operand][normlab.precision.operands.encode_operand] keeps the same operand as a
low-precision GEMM would store it: integer element codes of the recipe's format (two E2M1
codes per byte for NVFP4) plus the scales (E8M0 codes for MX, E4M3 codes and the float32
tensor scale for NVFP4, float32 inverse scales for FP8), and
[decode_operand][normlab.precision.operands.decode_operand] turns it back into exactly the
values `fake_operand` gives. Training layers save the encoded wgrad operand for backward
(Transformer Engine's quantised tensors with columnwise usage) instead of a float32 copy.

Each function is written once against the array namespace `xp`
([normlab.precision.namespace][]) from the recipes' shared steps
([normlab.precision.recipe_core][]); the operand enters as its float32 value (16-bit
inputs widen exactly), as the layer's float32 GEMMs take it. On NumPy arrays each runs
the numba kernel of its name (`normlab.kernels.operand`) where one serves the call: the
same values in one pass over the operand, reading float32 or bfloat16 in place.

Codes are [normlab.precision.operand_codes][] (a NaN outside a NaN-scaled block takes the
format's NaN code). `order` fixes the results' layout: `"C"` rows contiguous, `"F"`
columns contiguous (the layout of each recipe's torch path); codes are stored with that
layout's contiguous axis last, NVFP4's paired along it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from normlab.precision import blocks
from normlab.precision import recipe_core as core
from normlab.precision.formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN, Format
from normlab.precision.namespace import ArrayNamespace, namespace_of
from normlab.precision.operand_codes import (
    Encoded,
    element_codes,
    element_values,
    pack_pairs,
    unpack_pairs,
)
from normlab.precision.recipe_formats import mx_element_format
from normlab.precision.recipes import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)

__all__ = [
    "KINDS",
    "OperandSpec",
    "decode_operand",
    "encode_operand",
    "fake_operand",
    "operand_spec",
]

KINDS = ("round", "tensor", "mx", "nvfp4", "block")
"""Operand kinds: elementwise rounding (Bf16 recipe), one scale per tensor (FP8 delayed and
current), MX blocks, NVFP4 blocks, blockwise FP8 tiles."""

_SCALED_BLOCKS = ("mx", "nvfp4", "block")


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantised: the recipe's settings for one role and axis.

    Attributes
    ----------
    kind : {"round", "tensor", "mx", "nvfp4", "block"}
        The recipe family (see `KINDS`).
    fmt : Format
        The element format.
    axis : int
        The GEMM's contraction axis of the 2-D operand (0 or 1): 1-D blocks run along it.
    size : int
        Block length (MX, NVFP4: 16, blockwise FP8); 0 for the other kinds.
    tile : bool
        Square `size` x `size` tiles instead of 1-D blocks (NVFP4 and blockwise weights).
    rule : str
        The MX scale rule.
    pow2 : bool
        Blockwise FP8: power-of-two scales.
    epsilon : float
        Blockwise FP8: the amax lower bound.
    """

    kind: str
    fmt: Format
    axis: int = 1
    size: int = 0
    tile: bool = False
    rule: str = "ocp"
    pow2: bool = False
    epsilon: float = 0.0

    @property
    def block(self) -> tuple[int, int]:
        """One block's (rows, columns) in the operand; (0, 0) for per-tensor and elementwise."""
        if self.kind not in _SCALED_BLOCKS:
            return (0, 0)
        if self.tile:
            return (self.size, self.size)
        return (self.size, 1) if self.axis == 0 else (1, self.size)

    def key(self) -> str:
        """A string that [from_key][normlab.precision.operands.OperandSpec.from_key] reads
        back (the form a compiled graph holds)."""
        return (f"{self.kind}:{self.fmt.name}:{self.axis}:{self.size}:{int(self.tile)}:"
                f"{self.rule}:{int(self.pow2)}:{self.epsilon!r}")

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def from_key(key: str) -> OperandSpec:
        """The spec that `key()` wrote."""
        kind, fmt, axis, size, tile, rule, pow2, eps = key.split(":")
        return OperandSpec(kind, mx_element_format(fmt), int(axis), int(size), tile == "1",
                           rule, pow2 == "1", float(eps))


def operand_spec(recipe: Any, role: str, axis: int) -> OperandSpec:
    """The spec of operand `role` (`"x"`, `"w"` or `"dy"`) blocked along `axis` under `recipe`.

    Parameters
    ----------
    recipe : Recipe
        A training recipe of [normlab.precision.recipes][].
    role : {"x", "w", "dy"}
        The operand.
    axis : int
        The GEMM's contraction axis of the operand (0 or 1).

    Returns
    -------
    spec : OperandSpec
        The operand's kind, element format, blocking axis and size, and scale rule.

    Examples
    --------
    >>> operand_spec(MXRecipe(), "dy", 0).block
    (32, 1)
    """
    fmt = recipe.format_for("backward" if role == "dy" else "forward")
    if isinstance(recipe, Bf16Recipe):
        return OperandSpec("round", fmt, axis)
    if isinstance(recipe, (Fp8DelayedRecipe, Fp8CurrentRecipe)):
        return OperandSpec("tensor", fmt, axis)
    if isinstance(recipe, MXRecipe):
        return OperandSpec("mx", fmt, axis, recipe.block_size, rule=recipe.scale_rule)
    if isinstance(recipe, NVFP4Recipe):
        return OperandSpec("nvfp4", FLOAT4_E2M1FN, axis, 16,
                           tile=role == "w" and recipe.two_d_weights)
    if isinstance(recipe, BlockwiseFp8Recipe):
        return OperandSpec("block", fmt, axis, recipe.block_size, tile=role == "w",
                           pow2=recipe.power_of_2_scales, epsilon=recipe.amax_epsilon)
    raise TypeError(f"unsupported recipe {recipe!r}")


def _layout(x: Any, order: str, xp: ArrayNamespace) -> Any:
    """Logical 2-D `x` as stored: `x` (order "C") or its transpose (order "F"), rows last."""
    return xp.ordered(x if order == "C" else xp.moveaxis(x, 0, 1), "C")


def _from_layout(stored: Any, order: str, xp: ArrayNamespace) -> Any:
    return stored if order == "C" else xp.moveaxis(stored, 0, 1)


def _blockwise_parts(x: Any, spec: OperandSpec, xp: ArrayNamespace) -> tuple[Any, Any]:
    """Blockwise FP8 `(data, scale_inv)`: 1 x k tiles along the axis (moved last) or k x k."""
    k = spec.size
    moved = x if spec.tile or spec.axis == 1 else xp.moveaxis(x, 0, 1)
    block = (k, k) if spec.tile else (1, k)
    data, _, inv = core.blockwise_quantize_parts(moved, spec.fmt, block=block,
                                                 epsilon=spec.epsilon,
                                                 power_of_2_scales=spec.pow2, xp=xp)
    return data, inv


def _blockwise_values(data: Any, inv: Any, spec: OperandSpec, xp: ArrayNamespace) -> Any:
    k = spec.size
    block = (k, k) if spec.tile else (1, k)
    out = core.blockwise_dequantize_values(data, inv, block=block, xp=xp)
    return out if spec.tile or spec.axis == 1 else xp.moveaxis(out, 0, 1)


def _nvfp4_layout(spec: OperandSpec) -> tuple[tuple[int, ...], int]:
    return ((16, 16), -1) if spec.tile else ((16,), spec.axis)


def _fake_reference(x: Any, spec: OperandSpec, scale: Any, seed: int | None,
                    order: str) -> Any:
    xp = namespace_of(x)
    with xp.quiet():
        w = xp.astype(x, "float32")  # R,C
        if spec.kind == "round":
            out = xp.astype(xp.quantize(w, spec.fmt, saturate=False), "float32")
        elif spec.kind == "tensor":
            data, inv = core.per_tensor_quantize(w, spec.fmt, scale, xp=xp)
            out = data * inv
        elif spec.kind == "mx":
            elems, codes = core.mx_quantize_parts(w, spec.fmt, block_size=spec.size,
                                                  axis=spec.axis, rule=spec.rule, xp=xp)
            out = core.mx_dequantize_values(elems, codes, block_size=spec.size,
                                            axis=spec.axis, xp=xp)
        elif spec.kind == "nvfp4":
            block, axis = _nvfp4_layout(spec)
            rounding = "nearest" if seed is None else "stochastic"
            parts = core.nvfp4_quantize_parts(w, block=block, axis=axis, rounding=rounding,
                                              seed=seed, xp=xp)
            out = core.nvfp4_dequantize_values(*parts, block=block, axis=axis, xp=xp)
        else:
            out = _blockwise_values(*_blockwise_parts(w, spec, xp), spec, xp)
        return xp.ordered(out, order)


def fake_operand(x: Any, spec: OperandSpec, *, scale: Any = None, seed: int | None = None,
                 order: str = "C", xp: ArrayNamespace | None = None) -> Any:
    """`dequantize(quantize(x))` of operand `x` under `spec`: the values its GEMM multiplies.

    Parameters
    ----------
    x : array, shape (R, C)
        float32, float64 or a 16-bit float (taken as its float32 value).
    spec : OperandSpec
        The recipe, role and axis.
    scale : array, optional
        The float32 scale (0-d) of the per-tensor kind.
    seed : int, optional
        NVFP4: round the elements stochastically with this stream (element i of x's
        flattened C order takes the word of `seed + i`).
    order : {"C", "F"}, optional
        The result's layout. Default "C".
    xp : ArrayNamespace, optional
        The namespace of `x` (default: inferred).

    Returns
    -------
    out : array of float32, shape (R, C)
        Bit for bit the recipe's public function dequantised.

    Examples
    --------
    >>> spec = operand_spec(MXRecipe("fp4"), "x", 1)
    >>> fake_operand(np.float32([[0.3, 1.0, 5.0, 7.0]]), spec).tolist()
    [[0.0, 1.0, 4.0, 8.0]]
    """
    xp = namespace_of(x) if xp is None else xp
    return xp.dispatch("fake_operand", _fake_reference, x, spec, scale, seed, order)


def _encode_reference(x: Any, spec: OperandSpec, scale: Any, order: str) -> Encoded:
    xp = namespace_of(x)
    with xp.quiet():
        w = xp.astype(x, "float32")  # R,C
        scales, tensor_scale = None, None
        if spec.kind == "round":
            elems = xp.astype(xp.quantize(w, spec.fmt, saturate=False), "float32")
        elif spec.kind == "tensor":
            elems, scales = core.per_tensor_quantize(w, spec.fmt, scale, xp=xp)
        elif spec.kind == "mx":
            elems, mx_codes = core.mx_quantize_parts(w, spec.fmt, block_size=spec.size,
                                                     axis=spec.axis, rule=spec.rule, xp=xp)
            scales = xp.astype(mx_codes, "uint8")
        elif spec.kind == "nvfp4":
            block, axis = _nvfp4_layout(spec)
            elems, s_b, tensor_scale = core.nvfp4_quantize_parts(w, block=block, axis=axis,
                                                                 xp=xp)
            scales = element_codes(s_b, FLOAT8_E4M3FN, xp)
        else:
            elems, scales = _blockwise_parts(w, spec, xp)
            elems = elems if spec.tile or spec.axis == 1 else xp.moveaxis(elems, 0, 1)
        codes = _layout(element_codes(elems, spec.fmt, xp), order, xp)
        if spec.kind == "nvfp4":
            codes = pack_pairs(codes, xp)
        return Encoded(codes, scales, tensor_scale)


def encode_operand(x: Any, spec: OperandSpec, *, scale: Any = None, order: str = "C",
                   xp: ArrayNamespace | None = None) -> Encoded:
    """Operand `x` as codes plus scales (round to nearest); decodes to `fake_operand(x, ...)`.

    Parameters
    ----------
    x : array, shape (R, C)
        float32, float64 or a 16-bit float (taken as its float32 value).
    spec : OperandSpec
        The recipe, role and axis.
    scale : array, optional
        The float32 scale (0-d) of the per-tensor kind.
    order : {"C", "F"}, optional
        The stored layout (see the module header). Default "C".
    xp : ArrayNamespace, optional
        The namespace of `x` (default: inferred).

    Returns
    -------
    encoded : Encoded
        The element codes, the per-block scales (codes or float32, by recipe) and NVFP4's
        tensor scale, which decode to the operand exactly.

    Examples
    --------
    >>> spec = operand_spec(Fp8CurrentRecipe(), "x", 1)
    >>> enc = encode_operand(np.float32([[1.0, -2.0]]), spec, scale=np.float32(1.0))
    >>> enc.codes.tolist(), float(enc.scales)
    ([[56, 192]], 1.0)
    """
    xp = namespace_of(x) if xp is None else xp
    out: Encoded = xp.dispatch("encode_operand", _encode_reference, x, spec, scale, order)
    return out


def _decode_reference(enc: Encoded, spec: OperandSpec, shape: tuple[int, int],
                      order: str) -> Any:
    xp = namespace_of(enc.codes)
    with xp.quiet():
        stored = enc.codes
        if spec.kind == "nvfp4":
            stored = unpack_pairs(stored, shape[0] if order == "F" else shape[1], xp)
        elems = element_values(_from_layout(stored, order, xp), spec.fmt, xp)  # R,C
        if spec.kind == "round":
            out = elems
        elif spec.kind == "tensor":
            out = elems * enc.scales
        elif spec.kind == "mx":
            out = core.mx_dequantize_values(elems, xp.astype(enc.scales, "int32"),
                                            block_size=spec.size, axis=spec.axis, xp=xp)
        elif spec.kind == "nvfp4":
            block, axis = _nvfp4_layout(spec)
            s_b = element_values(enc.scales, FLOAT8_E4M3FN, xp)
            grid = s_b if spec.tile else xp.moveaxis(s_b, axis, -1)
            moved = xp.moveaxis(elems, axis, -1)
            nan = blocks.spread(xp.isnan(grid), block, tuple(moved.shape), xp=xp)
            elems = xp.moveaxis(xp.where(nan, xp.scalar(float("nan"), moved), moved), -1, axis)
            out = core.nvfp4_dequantize_values(elems, s_b, enc.tensor_scale, block=block,
                                               axis=axis, xp=xp)
        else:
            moved = elems if spec.tile or spec.axis == 1 else xp.moveaxis(elems, 0, 1)
            out = _blockwise_values(moved, enc.scales, spec, xp)
        return xp.ordered(out, order)


def decode_operand(enc: Encoded, spec: OperandSpec, shape: tuple[int, int], *,
                   order: str = "C", xp: ArrayNamespace | None = None) -> Any:
    """The float32 operand that `enc` holds: `fake_operand` of the encoded input, bit for bit.

    Parameters
    ----------
    enc : Encoded
        What [encode_operand][normlab.precision.operands.encode_operand] returned.
    spec : OperandSpec
        The spec it was encoded with.
    shape : tuple of int
        The operand's (R, C).
    order : {"C", "F"}, optional
        The layout it was encoded with, and the result's. Default "C".
    xp : ArrayNamespace, optional
        The namespace of the codes (default: inferred).

    Returns
    -------
    out : array of float32, shape (R, C)
        The dequantised operand, in the layout `order`.

    Examples
    --------
    >>> spec = operand_spec(NVFP4Recipe(), "x", 1)
    >>> x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    >>> enc = encode_operand(x, spec)
    >>> enc.codes.shape, bool((decode_operand(enc, spec, x.shape) == fake_operand(x, spec)).all())
    ((2, 8), True)
    """
    xp = namespace_of(enc.codes) if xp is None else xp
    return xp.dispatch("decode_operand", _decode_reference, enc, spec, tuple(shape), order)
