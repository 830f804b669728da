"""Blockwise FP8 on tensors: one float32 scale per tile (DeepSeek-V3; TE ``Float8BlockScaling``).

Dimension letters: R, C the last two axes, r x c the block, nR = ceil(R / r), nC =
ceil(C / c).

Contract: :func:`normlab.precision.blockwise_quantize` bit for bit, on any device: per
block ``a = max(amax_b, amax_epsilon)`` (float32), ``scale = float32(fp8_max / a)`` (1
when a is 0, inf or NaN; FLT_MAX on overflow; mantissa cleared with
``power_of_2_scales``), ``data = sat_round(x * scale)`` (float32; float64 for float64
input), ``scale_inv = float32(1 / scale)``, ``dequantize() = data * scale_inv``.
DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.3.2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import check_finite_real
from normlab.precision._blocks import check_block_shape
from normlab.precision.formats import Format
from normlab.torch import _blocks
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.quantize import _check_tensor, quantize

__all__ = ["BlockwiseTensor", "blockwise_quantize"]

_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class BlockwiseTensor:
    """Blockwise-scaled FP8: ``data`` (float32, x's shape), per-block ``scales`` and
    ``scale_inv`` (float32, x's shape with the blocked axes replaced by (nR, nC) or nC)."""

    data: torch.Tensor
    scales: torch.Tensor
    scale_inv: torch.Tensor
    fmt: Format
    block_shape: tuple[int, ...]

    def dequantize(self) -> torch.Tensor:
        """``data * scale_inv`` (per block) in float32, x's shape."""
        inv = _blocks.expand(self.scale_inv, self.block_shape, tuple(self.data.shape))
        return self.data * inv


def block_scales(amax: torch.Tensor, fp8_max: float, amax_epsilon: float,
                 power_of_2_scales: bool) -> torch.Tensor:
    """TE's ``compute_scale_from_amax`` on a tensor of amaxes (float32 result)."""
    a32 = amax.to(torch.float32)
    a = torch.where(torch.isnan(a32), a32, torch.clamp(a32, min=float(np.float32(amax_epsilon))))
    s = torch.tensor(float(np.float32(fp8_max)), dtype=torch.float32, device=a.device) / a
    s = torch.where(torch.isinf(s), _F32_MAX, s)
    s = torch.where(torch.isfinite(a) & (a > 0), s, 1.0)
    if power_of_2_scales:
        s = (s.view(torch.int32) & -(2**23)).view(torch.float32)
    return s


def blockwise_quantize(
    t: torch.Tensor,
    fmt: Any = "e4m3",
    *,
    block_shape: tuple[int, ...] = (1, 128),
    power_of_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> BlockwiseTensor:
    """Quantise ``t`` to FP8 with one float32 scale per block (formulas in the header).

    Parameters
    ----------
    t : Tensor with at least len(block_shape) axes
    fmt : "e4m3" (default), "e5m2", any Format or torch dtype
    block_shape : (r, c) tiles of the last two axes or (c,) runs of the last axis
    power_of_2_scales : round each scale down to a power of two
    amax_epsilon : lower bound (>= 0) on each block's amax

    Returns
    -------
    BlockwiseTensor on t's device, equal to the NumPy twin's arrays bit for bit.

    Raises
    ------
    TypeError / ValueError: bad tensor, fmt, block shape, epsilon or flag.

    Example
    -------
    >>> q = blockwise_quantize(torch.tensor([[1.0, -2.0, 0.5, 4.0]]), block_shape=(1, 4))
    >>> q.data.tolist()
    [[112.0, -224.0, 56.0, 448.0]]
    """
    t = _check_tensor(t)
    f = get_format(fmt)
    block = check_block_shape(block_shape, t.dim())
    eps = check_finite_real(amax_epsilon, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {amax_epsilon!r}")
    if not isinstance(power_of_2_scales, bool):
        raise TypeError(f"power_of_2_scales must be a bool; got {power_of_2_scales!r}")
    scales = block_scales(_blocks.block_amax(t, block), f.max, eps, power_of_2_scales)
    inv = torch.div(torch.ones_like(scales), scales)
    work = _blocks.work_dtype(t)
    scaled = t.detach().to(work) * _blocks.expand(scales, block, tuple(t.shape)).to(work)
    data = quantize(scaled, f, saturate=True).to(torch.float32)
    return BlockwiseTensor(data, scales, inv, f, block)
