r"""Quantizers: how one GEMM operand is quantised, one immutable class per scaling family.

Dimension letters: R, C the operand's rows and columns; one block covers r x c of them
(`Quantizer.block`).

A training recipe ([normlab.precision.scaled.recipes][]) decides, in its `quantizer(role, axis)`
method and nowhere else, which quantizer each GEMM operand gets: x, W or dy, blocked along
the GEMM's contraction axis. Everything downstream (the operand functions of
[normlab.precision.operands.operand][], the numba adapter, the torch custom ops, the training
layer, the benchmark, the numerics inspector) asks the quantizer, never the recipe's class:

| family | class | scales | recipes |
|---|---|---|---|
| elementwise rounding | `RoundQuantizer` | none | Bf16 |
| none (the operand as it is) | `IdentityQuantizer` | none | rowwise, wgrad high |
| FP8, whole tensor | `Fp8TensorQuantizer` | one float32, given | FP8 delayed, current |
| FP8, per row, 1-D block or tile | `Fp8BlockQuantizer` | float32 each | blockwise, rowwise |
| MX | `MXQuantizer` | E8M0 per block | MX |
| NVFP4 | `NVFP4Quantizer` | E4M3 per block, float32 per tensor | NVFP4 |

Each class holds its family's reference arithmetic (the recipes' shared steps of
[normlab.precision.scaled.arithmetic][], written once against the array namespace), its encoded
layout and a stable [key][normlab.precision.scaled.quantizer.Quantizer.key] for caches and
compiled graphs; [Quantizer.from_key][normlab.precision.scaled.quantizer.Quantizer.from_key]
reads it back and raises TypeError for a family it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from normlab.precision.formats.format import FLOAT32, Format
from normlab.precision.operands.codes import Encoded
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.microscaling import MXQuantizer, NVFP4Quantizer
from normlab.precision.scaled.namespace import ArrayNamespace
from normlab.precision.scaled.quantizer import Quantizer, cdiv

__all__ = [
    "Fp8BlockQuantizer",
    "Fp8TensorQuantizer",
    "IdentityQuantizer",
    "MXQuantizer",
    "NVFP4Quantizer",
    "Quantizer",
    "RoundQuantizer",
]

@dataclass(frozen=True)
class RoundQuantizer(Quantizer):
    """Elementwise rounding to nearest even, no scale, no saturation (the Bf16 recipe)."""

    family: ClassVar[str] = "round"
    """The family's name, the first field of its key."""
    saturates: ClassVar[bool] = False
    """Scaled elements saturate at the format's max."""
    has_scales: ClassVar[bool] = False
    """The operand carries scales."""

    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """This family's `values` (see `Quantizer`)."""
        return xp.astype(xp.quantize(w, self.fmt, saturate=False), "float32")

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """This family's `quantized` (see `Quantizer`)."""
        return self.values(w, scale, None, xp), None, None

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `dequantized` (see `Quantizer`)."""
        return elems

    def encoded(self, elems: Any, scales: Any, tensor_scale: Any) -> Encoded:
        """This family's `encoded` (see `Quantizer`)."""
        return Encoded(elems, None, None)

    def identity_on(self, fmt: Format | None) -> bool:
        """Rounding to `fmt` itself keeps every value (see `Quantizer`)."""
        return fmt is not None and fmt == self.fmt


@dataclass(frozen=True)
class IdentityQuantizer(RoundQuantizer):
    """No quantisation: the operand as it is (torchao's disabled cast, the weight gradient
    of its `rowwise_with_gw_hp` recipe).

    It runs as rounding to the operand's own format (`for_input`), which changes nothing
    and keeps a 16-bit operand in 2 bytes when it is saved for backward; by itself it is
    rounding to float32.
    """

    fmt: Format = FLOAT32
    """Float32 by itself; `for_input` takes the operand's own format."""

    family: ClassVar[str] = "identity"
    """The family's name, the first field of its key."""

    def for_input(self, fmt: Format | None) -> Quantizer:
        """Rounding to `fmt` (float32 for None): the values as they are."""
        return RoundQuantizer(FLOAT32 if fmt is None else fmt)


@dataclass(frozen=True)
class Fp8TensorQuantizer(Quantizer):
    """FP8 with one float32 scale for the whole tensor, given by the caller (delayed or
    current scaling): `sat_round(w * s) * float32(1 / s)`."""

    family: ClassVar[str] = "fp8_tensor"
    """The family's name, the first field of its key."""
    takes_scale: ClassVar[bool] = True
    """A per-tensor scale is passed in."""

    granularity: ClassVar[str] = "tensor"
    """The scale granularity, as torchao names it."""

    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """This family's `values` (see `Quantizer`)."""
        data, inv = core.per_tensor_quantize(w, self.fmt, scale, xp=xp)
        return data * inv

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """This family's `quantized` (see `Quantizer`)."""
        data, inv = core.per_tensor_quantize(w, self.fmt, scale, xp=xp)
        return data, inv, None

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `dequantized` (see `Quantizer`)."""
        return elems * enc.scales

    def scale_grid(self, shape: tuple[Any, Any]) -> tuple[tuple[Any, ...], str]:
        """This family's `scale_grid` (see `Quantizer`)."""
        return (), "float32"

    def encoded(self, elems: Any, scales: Any, tensor_scale: Any) -> Encoded:
        """This family's `encoded` (see `Quantizer`)."""
        return Encoded(elems, scales, None)

    def multipliers(self, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `multipliers` (see `Quantizer`): the one `scale_inv`."""
        return xp.reshape(enc.scales, (1,))


@dataclass(frozen=True)
class Fp8BlockQuantizer(Quantizer):
    r"""FP8 with a float32 scale per slice along `axis`, per 1-D block or per square tile.

    Per block $s = m_{fp8} / \max(\mathrm{amax}_b, \epsilon)$
    ([blockwise_scales][normlab.precision.scaled.block_scales.blockwise_scales]: 1 for a block
    whose amax is 0, inf or NaN, or NaN for the last two with `nonfinite_nan`; the input
    dtype's max for an overflowing quotient), a power of two with `pow2`, elements
    `sat_round(w * s)`, values `elements * float32(1 / s)`.

    Attributes
    ----------
    size : int
        Block length along `axis`; 0 for one block spanning the whole axis (a scale per
        row of the operand's other axis: torchao's axiswise granularity). Square `size` x
        `size` tiles with `tile`.
    tile : bool
        Square tiles (blockwise FP8 weights) instead of 1-D blocks.
    pow2 : bool
        Power-of-two scales.
    epsilon : float
        The amax lower bound.
    nonfinite_nan : bool
        A block holding an inf or a NaN becomes all NaN (torchao) instead of saturating.
    """

    size: int = 128
    tile: bool = False
    pow2: bool = False
    epsilon: float = 0.0
    nonfinite_nan: bool = False

    family: ClassVar[str] = "fp8_block"
    """The family's name, the first field of its key."""

    @property
    def granularity(self) -> str:
        """`"tile"`, `"block"` or `"axis"` (one scale per slice along `axis`)."""
        if self.tile:
            return "tile"
        return "block" if self.size else "axis"

    @property
    def block(self) -> tuple[int, int]:
        """This family's `block` (see `Quantizer`); 0 stands for the whole axis."""
        if self.tile:
            return (self.size, self.size)
        return (self.size, 1) if self.axis == 0 else (1, self.size)

    @property
    def scales_transposed(self) -> bool:
        """This family's `scales_transposed` (see `Quantizer`)."""
        return not self.tile and self.axis == 0

    def _block_of(self, moved: Any) -> tuple[int, int]:
        """The block of the operand as `quantized` moves it (1-D blocks along its rows)."""
        if self.tile:
            return (self.size, self.size)
        return (1, self.size or max(int(moved.shape[1]), 1))

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """This family's `quantized` (see `Quantizer`)."""
        moved = xp.moveaxis(w, 0, 1) if self.scales_transposed else w
        data, _, inv = core.blockwise_quantize_parts(moved, self.fmt, block=self._block_of(moved),
                                                     epsilon=self.epsilon,
                                                     power_of_2_scales=self.pow2,
                                                     nonfinite_nan=self.nonfinite_nan, xp=xp)
        return (xp.moveaxis(data, 0, 1) if self.scales_transposed else data), inv, None

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `dequantized` (see `Quantizer`)."""
        moved = xp.moveaxis(elems, 0, 1) if self.scales_transposed else elems
        out = core.blockwise_dequantize_values(moved, enc.scales, block=self._block_of(moved),
                                               xp=xp)
        return xp.moveaxis(out, 0, 1) if self.scales_transposed else out

    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """This family's `values` (see `Quantizer`)."""
        data, inv, _ = self.quantized(w, scale, xp)
        return self.dequantized(data, Encoded(None, inv), xp)

    def scale_grid(self, shape: tuple[Any, Any]) -> tuple[tuple[Any, ...], str]:
        """This family's `scale_grid` (see `Quantizer`)."""
        r, c = shape
        k = self.size
        if self.tile:
            return (cdiv(r, k), cdiv(c, k)), "float32"
        if k == 0:
            return ((r, 1) if self.axis == 1 else (c, 1)), "float32"
        return ((r, cdiv(c, k)) if self.axis == 1 else (c, cdiv(r, k))), "float32"

    def encoded(self, elems: Any, scales: Any, tensor_scale: Any) -> Encoded:
        """This family's `encoded` (see `Quantizer`)."""
        return Encoded(elems, scales, None)

    def multipliers(self, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `multipliers` (see `Quantizer`): each block's `scale_inv`."""
        return xp.moveaxis(enc.scales, 0, 1) if self.scales_transposed else enc.scales

