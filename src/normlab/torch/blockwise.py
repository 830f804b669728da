r"""Blockwise FP8 on tensors: one float32 scale per tile (DeepSeek-V3; TE `Float8BlockScaling`).

Dimension letters: R, C the last two axes, r x c the block, nR = ceil(R / r), nC =
ceil(C / c).

Contract: [normlab.precision.blockwise_quantize][] bit for bit, on any device, because
both run [blockwise_quantize_parts][normlab.precision.recipe_core.blockwise_quantize_parts]
(scales by [blockwise_scales][normlab.precision.block_scales.blockwise_scales], with the
input dtype's max for an overflowing quotient: bfloat16 and float16 tensors as TE) through
their array namespace; this module validates arguments and holds tensors.
DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.3.2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab._validate import check_finite_real
from normlab.precision import recipe_core as core
from normlab.precision.blocks import check_block_shape
from normlab.precision.formats import Format
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["BlockwiseTensor", "blockwise_quantize"]


@dataclass(frozen=True)
class BlockwiseTensor:
    """A blockwise-scaled FP8 tensor.

    Attributes
    ----------
    data : torch.Tensor
        float32, x's shape, values of `fmt`.
    scales : torch.Tensor
        float32 encode scales, x's shape with the blocked axes replaced by (nR, nC) or nC.
    scale_inv : torch.Tensor
        float32 decode scales `float32(1 / scales)`.
    fmt : Format
        The FP8 format.
    block_shape : tuple of int
        The block shape.
    """

    data: torch.Tensor
    scales: torch.Tensor
    scale_inv: torch.Tensor
    fmt: Format
    block_shape: tuple[int, ...]

    def dequantize(self) -> torch.Tensor:
        """`data * scale_inv` (per block) in float32, x's shape."""
        return core.blockwise_dequantize_values(self.data, self.scale_inv,
                                                block=self.block_shape, xp=TORCH)


def blockwise_quantize(
    t: torch.Tensor,
    fmt: Any = "e4m3",
    *,
    block_shape: tuple[int, ...] = (1, 128),
    power_of_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> BlockwiseTensor:
    """Quantise `t` to FP8 with one float32 scale per block (formulas in the NumPy twin).

    Parameters
    ----------
    t : torch.Tensor
        At least `len(block_shape)` axes.
    fmt : Format, str or torch.dtype, optional
        `"e4m3"` (default), `"e5m2"` or any format.
    block_shape : tuple of int, optional
        `(r, c)` tiles of the last two axes or `(c,)` runs of the last axis.
    power_of_2_scales : bool, optional
        Round each scale down to a power of two. Default False.
    amax_epsilon : float, optional
        Lower bound (>= 0) on each block's amax. Default 0.

    Returns
    -------
    q : BlockwiseTensor
        On `t`'s device, equal to the NumPy twin's arrays bit for bit.

    Raises
    ------
    TypeError, ValueError
        A bad tensor, fmt, block shape, epsilon or flag.

    Examples
    --------
    >>> q = blockwise_quantize(torch.tensor([[1.0, -2.0, 0.5, 4.0]]), block_shape=(1, 4))
    >>> q.data.tolist()
    [[112.0, -224.0, 56.0, 448.0]]
    """
    t = check_tensor(t)
    f = get_format(fmt)
    block = check_block_shape(block_shape, t.dim())
    eps = check_finite_real(amax_epsilon, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {amax_epsilon!r}")
    if not isinstance(power_of_2_scales, bool):
        raise TypeError(f"power_of_2_scales must be a bool; got {power_of_2_scales!r}")
    data, scales, inv = core.blockwise_quantize_parts(
        t.detach(), f, block=block, epsilon=eps, power_of_2_scales=power_of_2_scales, xp=TORCH)
    return BlockwiseTensor(data, scales, inv, f, block)
