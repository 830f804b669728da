"""The quantizers of the microscaling formats: MX (E8M0 block scales) and NVFP4 (E4M3 block
scales and a float32 tensor scale).

Part of `normlab.precision.scaled.quantizers` (which re-exports both classes): the same contract,
one class per scaling family, its reference arithmetic written once against the array
namespace through [normlab.precision.scaled.arithmetic][].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from normlab.precision.formats.format import FLOAT4_E2M1FN, FLOAT8_E4M3FN, Format
from normlab.precision.operands.codes import Encoded, element_codes, element_values
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled import tiling as blocks
from normlab.precision.scaled.namespace import ArrayNamespace
from normlab.precision.scaled.quantizer import Quantizer, cdiv

__all__ = ["MXQuantizer", "NVFP4Quantizer"]


@dataclass(frozen=True)
class MXQuantizer(Quantizer):
    """OCP Microscaling: an E8M0 scale per `size` elements along `axis`.

    Attributes
    ----------
    size : int
        Elements per scale.
    rule : {"ocp", "round_up"}
        The scale rule ([mx_scale_codes][normlab.precision.scaled.block_scales.mx_scale_codes]).
    """

    size: int = 32
    rule: str = "ocp"

    family: ClassVar[str] = "mx"
    """The family's name, the first field of its key."""
    columns_first_off_cpu: ClassVar[bool] = True
    """Off the CPU, 1-D blocks along axis 0 are computed columns first."""

    @property
    def block(self) -> tuple[int, int]:
        """This family's `block` (see `Quantizer`)."""
        return (self.size, 1) if self.axis == 0 else (1, self.size)

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """This family's `quantized` (see `Quantizer`)."""
        elems, codes = core.mx_quantize_parts(w, self.fmt, block_size=self.size,
                                              axis=self.axis, rule=self.rule, xp=xp)
        return elems, xp.astype(codes, "uint8"), None

    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """This family's `values` (see `Quantizer`)."""
        elems, codes = core.mx_quantize_parts(w, self.fmt, block_size=self.size,
                                              axis=self.axis, rule=self.rule, xp=xp)
        return core.mx_dequantize_values(elems, codes, block_size=self.size, axis=self.axis,
                                         xp=xp)

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `dequantized` (see `Quantizer`)."""
        return core.mx_dequantize_values(elems, xp.astype(enc.scales, "int32"),
                                         block_size=self.size, axis=self.axis, xp=xp)

    def scale_grid(self, shape: tuple[Any, Any]) -> tuple[tuple[Any, ...], str]:
        """This family's `scale_grid` (see `Quantizer`)."""
        r, c = shape
        return ((r, cdiv(c, self.size)) if self.axis == 1
                else (cdiv(r, self.size), c)), "uint8"

    def encoded(self, elems: Any, scales: Any, tensor_scale: Any) -> Encoded:
        """This family's `encoded` (see `Quantizer`)."""
        return Encoded(elems, scales, None)

    def multipliers(self, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `multipliers` (see `Quantizer`): $2^{code - 127}$ (NaN for 255)."""
        return core.e8m0_values(enc.scales, xp=xp)


@dataclass(frozen=True)
class NVFP4Quantizer(Quantizer):
    """NVFP4: E2M1 elements, an E4M3 scale per 16 elements along `axis` (or per 16 x 16
    tile), a float32 tensor scale; stochastic rounding with `seed`.

    Attributes
    ----------
    tile : bool
        16 x 16 tiles (weights of the recipe's `two_d_weights`) instead of 1 x 16 blocks.
    """

    fmt: Format = FLOAT4_E2M1FN
    """The element format."""
    axis: int = 1
    """The GEMM's contraction axis of the operand (0 or 1)."""
    tile: bool = False

    family: ClassVar[str] = "nvfp4"
    """The family's name, the first field of its key."""
    stochastic: ClassVar[bool] = True
    """Elements may be rounded stochastically (`seed=`)."""
    packed: ClassVar[bool] = True
    """Two element codes share a byte."""
    columns_first_off_cpu: ClassVar[bool] = True
    """Off the CPU, 1-D blocks along axis 0 are computed columns first."""
    size: ClassVar[int] = 16
    """Elements per block (16)."""

    @property
    def block(self) -> tuple[int, int]:
        """This family's `block` (see `Quantizer`)."""
        if self.tile:
            return (16, 16)
        return (16, 1) if self.axis == 0 else (1, 16)

    def _layout(self) -> tuple[tuple[int, ...], int]:
        return ((16, 16), -1) if self.tile else ((16,), self.axis)

    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """This family's `values` (see `Quantizer`)."""
        block, axis = self._layout()
        rounding = "nearest" if seed is None else "stochastic"
        parts = core.nvfp4_quantize_parts(w, block=block, axis=axis, rounding=rounding,
                                          seed=seed, xp=xp)
        return core.nvfp4_dequantize_values(*parts, block=block, axis=axis, xp=xp)

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """This family's `quantized` (see `Quantizer`)."""
        block, axis = self._layout()
        elems, s_b, tensor_scale = core.nvfp4_quantize_parts(w, block=block, axis=axis, xp=xp)
        return elems, element_codes(s_b, FLOAT8_E4M3FN, xp), tensor_scale

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `dequantized` (see `Quantizer`)."""
        block, axis = self._layout()
        s_b = element_values(enc.scales, FLOAT8_E4M3FN, xp)
        grid = s_b if self.tile else xp.moveaxis(s_b, axis, -1)
        moved = xp.moveaxis(elems, axis, -1)
        nan = blocks.spread(xp.isnan(grid), block, tuple(moved.shape), xp=xp)
        elems = xp.moveaxis(xp.where(nan, xp.scalar(float("nan"), moved), moved), -1, axis)
        return core.nvfp4_dequantize_values(elems, s_b, enc.tensor_scale, block=block,
                                            axis=axis, xp=xp)

    def scale_grid(self, shape: tuple[Any, Any]) -> tuple[tuple[Any, ...], str]:
        """This family's `scale_grid` (see `Quantizer`)."""
        r, c = shape
        if self.tile:
            return (cdiv(r, 16), cdiv(c, 16)), "uint8"
        return ((r, cdiv(c, 16)) if self.axis == 1 else (cdiv(r, 16), c)), "uint8"

    def tensor_scale_shape(self) -> tuple[int, ...]:
        """This family's `tensor_scale_shape` (see `Quantizer`)."""
        return ()

    def multipliers(self, enc: Encoded, xp: ArrayNamespace) -> Any:
        """This family's `multipliers` (see `Quantizer`): block scale times $S_{dec}$."""
        s_b = element_values(enc.scales, FLOAT8_E4M3FN, xp)
        return s_b * xp.astype(enc.tensor_scale, "float32")
