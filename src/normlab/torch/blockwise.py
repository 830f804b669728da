r"""Blockwise FP8 on tensors: one float32 scale per tile (DeepSeek-V3; TE `Float8BlockScaling`).

Dimension letters: R, C the last two axes, r x c the block, nR = ceil(R / r), nC =
ceil(C / c).

Contract: [normlab.precision.blockwise_quantize][] bit for bit, on any device, because
both run [blockwise_quantize_parts][normlab.precision.scaled.arithmetic.blockwise_quantize_parts]
(scales by [blockwise_scales][normlab.precision.scaled.block_scales.blockwise_scales], with the
input dtype's max for an overflowing quotient: bfloat16 and float16 tensors as TE) through
their array namespace; this module validates arguments and holds tensors.
DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.3.2.
"""

from __future__ import annotations

from typing import Any

from normlab._moved import renamed_arguments
from normlab.precision.scaled.blockwise import BlockwiseTensor, blockwise_tensor
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["BlockwiseTensor", "blockwise_quantize"]


@renamed_arguments(t="x")
def blockwise_quantize(
    x: torch.Tensor,
    fmt: Any = "e4m3",
    *,
    block_shape: tuple[int, ...] = (1, 128),
    power_of_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> BlockwiseTensor:
    """Quantise `x` to FP8 with one float32 scale per block (formulas in the NumPy twin).

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, bfloat16 or float16 (bfloat16 and float16 keep their own overflow
        value, as TE), with at least `len(block_shape)` axes.
    fmt : Format, str or torch.dtype, optional
        The FP8 format; E4M3 by default.
    block_shape : tuple of int, optional
        The tiles, as [normlab.precision.blockwise_quantize][] takes them.
    power_of_2_scales : bool, optional
        Power-of-two scales (off by default).
    amax_epsilon : float, optional
        The floor of every tile's amax (0 by default).

    Returns
    -------
    q : BlockwiseTensor
        On `x`'s device, equal to the NumPy twin's arrays bit for bit.

    Raises
    ------
    TypeError, ValueError
        As the NumPy twin (and for a non-tensor `x`).

    Examples
    --------
    >>> q = blockwise_quantize(torch.tensor([[1.0, -2.0, 0.5, 4.0]]), block_shape=(1, 4))
    >>> q.data.tolist()
    [[112.0, -224.0, 56.0, 448.0]]
    """
    x = check_tensor(x)
    return blockwise_tensor(x.detach(), get_format(fmt), block_shape, power_of_2_scales,
                            amax_epsilon, xp=TORCH)
