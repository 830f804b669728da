"""Blockwise FP8: one float32 scale per tile (DeepSeek-V3; TE ``Float8BlockScaling``).

Dimension letters: R, C the last two axes of x, r x c the block shape, nR = ceil(R / r),
nC = ceil(C / c) (a 1-tuple block shape ``(c,)`` tiles the last axis only).

Contract: per block, with amax_b = max |x| over the block (float32),
``a = max(amax_b, amax_epsilon)``; ``scale = (fp8_max / a)`` in float32, 1 when a is 0,
inf or NaN, FLT_MAX when the quotient overflows, and with ``power_of_2_scales`` rounded
down to a power of two by clearing its float32 mantissa. This is TE's
``compute_scale_from_amax`` (``transformer_engine/common/recipe/recipe_common.cuh``), the
rule of its blockwise cast (``Float8BlockScaling``: 1 x 128 tiles for activations and
gradients, 128 x 128 blocks for weights, as DeepSeek-AI, "DeepSeek-V3 Technical Report",
2024, sec. 3.3.2). ``data = sat_round(x * scale)`` (x * scale in float32; float64 for
float64 input), ``scale_inv = float32(1 / scale)`` is stored per block, and
``dequantize() = data * scale_inv``. NaN in a block makes its data NaN (the scale is 1).

Example
-------
>>> x = np.array([[1.0, -2.0, 0.5, 4.0]], np.float32)   # one 1 x 4 block, amax 4
>>> t = blockwise_quantize(x, block_shape=(1, 4))
>>> t.scale_inv.tolist(), t.data.tolist()   # scale 448 / 4 = 112
([[0.008928571827709675]], [[112.0, -224.0, 56.0, 448.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real
from normlab.precision import _blocks
from normlab.precision.formats import Format, get_format
from normlab.precision.rounding import quantize

__all__ = ["BlockwiseTensor", "blockwise_quantize"]

_F32 = np.float32
_F32_MAX = _F32(np.finfo(np.float32).max)


@dataclass(frozen=True)
class BlockwiseTensor:
    """A blockwise-scaled FP8 array.

    data: float32, x's shape, values of ``fmt``. scale_inv: float32 decode scales, x's
    shape with the blocked axes replaced by (nR, nC) (or nC). scales: the encode scales.
    """

    data: np.ndarray
    scales: np.ndarray
    scale_inv: np.ndarray
    fmt: Format
    block_shape: tuple[int, ...]

    def dequantize(self) -> np.ndarray:
        """``data * scale_inv`` (per block) in float32, x's shape."""
        inv = _blocks.expand(self.scale_inv, self.block_shape, self.data.shape)
        return (self.data * inv).astype(np.float32)


def block_scales(amax: np.ndarray, fp8_max: float, amax_epsilon: float,
                 power_of_2_scales: bool) -> np.ndarray:
    """TE's ``compute_scale_from_amax`` on an array of float32 amaxes (see the header)."""
    a = np.maximum(amax.astype(np.float32), _F32(amax_epsilon))  # NaN stays NaN
    a = np.where(np.isnan(amax), np.nan, a).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = (_F32(fp8_max) / a).astype(np.float32)
    s = np.where(np.isinf(s), _F32_MAX, s)
    s = np.where(np.isfinite(a) & (a > 0), s, _F32(1.0)).astype(np.float32)
    if power_of_2_scales:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return s


def blockwise_quantize(
    x: Any,
    fmt: Format | str = "e4m3",
    *,
    block_shape: tuple[int, ...] = (1, 128),
    power_of_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> BlockwiseTensor:
    """Quantise ``x`` to FP8 with one float32 scale per block (formulas in the header).

    Parameters
    ----------
    x : float array with at least len(block_shape) axes
    fmt : "e4m3" (default) or "e5m2", or any Format
    block_shape : (r, c) tiles of the last two axes ((1, 128) activations and gradients,
        (128, 128) weights) or (c,) runs of the last axis
    power_of_2_scales : bool
        Round each scale down to a power of two (exact rescaling).
    amax_epsilon : float >= 0
        Lower bound on each block's amax.

    Returns
    -------
    BlockwiseTensor

    Raises
    ------
    TypeError / ValueError: non-float x, bad fmt, block shape, epsilon or flag.

    Example
    -------
    >>> x = np.array([[3.0, 0.25], [-1.0, 0.0]], np.float32)  # one 2 x 2 block, amax 3
    >>> t = blockwise_quantize(x, block_shape=(2, 2), power_of_2_scales=True)
    >>> t.scales.tolist(), t.data.tolist()   # 448 / 3 = 149.3 -> 128 (power of two)
    ([[128.0]], [[384.0, 32.0], [-128.0, 0.0]])
    """
    arr = as_float_array(x, "x", min_ndim=1)
    f = get_format(fmt)
    block = _blocks.check_block_shape(block_shape, arr.ndim)
    eps = check_finite_real(amax_epsilon, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {amax_epsilon!r}")
    if not isinstance(power_of_2_scales, (bool, np.bool_)):
        raise TypeError(f"power_of_2_scales must be a bool; got {power_of_2_scales!r}")
    amax = _blocks.block_amax(arr, block)
    with np.errstate(over="ignore", invalid="ignore"):
        scales = block_scales(amax, f.max, eps, bool(power_of_2_scales))
        inv = (_F32(1.0) / scales).astype(np.float32)
        work = _blocks.work_dtype(arr)
        scaled = _blocks.multiply_blocks(arr.astype(work, copy=False), scales.astype(work), block)
        data = quantize(scaled, f, saturate=True).astype(np.float32, copy=False)
    return BlockwiseTensor(data, scales, inv, f, block)
