r"""Blockwise FP8: one float32 scale per tile (DeepSeek-V3; TE `Float8BlockScaling`).

Dimension letters: R, C the last two axes of x, r x c the block shape, nR = ceil(R / r),
nC = ceil(C / c) (a 1-tuple block shape `(c,)` tiles the last axis only).

Contract: per block, with $\mathrm{amax}_b$ = max |x| over the block (float32),
$a = \max(\mathrm{amax}_b, \epsilon)$ and $s = m_{fp8} / a$ in float32: 1 when $a$ is 0,
inf or NaN; when the quotient overflows, the largest value of x's dtype (float32's for
float32 and float64 input, bfloat16's or float16's for those inputs, as TE's
`compute_scale_from_types`); with `power_of_2_scales` rounded down to a power of two by
clearing its float32 mantissa. This is TE's `compute_scale_from_amax`
(`transformer_engine/common/recipe/recipe_common.cuh`), the rule of its blockwise cast
(`Float8BlockScaling`: 1 x 128 tiles for activations and gradients, 128 x 128 blocks for
weights, as DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.3.2), computed by
[blockwise_scales][normlab.precision.scaled.block_scales.blockwise_scales], shared with the
torch twin and the training layer. `data = sat_round(x * scale)` (x * scale in float32;
float64 for float64 input), `scale_inv = float32(1 / scale)` is stored per block, and
`dequantize() = data * scale_inv`. A NaN makes its block's scale 1 (the amax is NaN) and
stays NaN in `data`.

Examples
--------
>>> x = np.array([[1.0, -2.0, 0.5, 4.0]], np.float32)   # one 1 x 4 block, amax 4
>>> t = blockwise_quantize(x, block_shape=(1, 4))
>>> t.scale_inv.tolist(), t.data.tolist()   # scale 448 / 4 = 112
([[0.008928571827709675]], [[112.0, -224.0, 56.0, 448.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab._validate import as_float_array, check_amax_epsilon, check_bool
from normlab.precision.formats.format import Format, get_format
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.namespace import NUMPY, ArrayNamespace, namespace_of
from normlab.precision.scaled.tiling import check_block_shape

__all__ = ["BlockwiseTensor", "blockwise_quantize"]


@dataclass(frozen=True)
class BlockwiseTensor:
    """A blockwise-scaled FP8 array: NumPy arrays here, tensors on the input's device from
    the torch twin.

    Attributes
    ----------
    data : numpy.ndarray or torch.Tensor
        float32, x's shape, values of `fmt`.
    scales : numpy.ndarray or torch.Tensor
        float32 encode scales, x's shape with the blocked axes replaced by (nR, nC) (or
        nC).
    scale_inv : numpy.ndarray or torch.Tensor
        float32 decode scales `float32(1 / scales)`, the shape of `scales`.
    fmt : Format
        The FP8 format.
    block_shape : tuple of int
        The block shape.
    """

    data: Any
    scales: Any
    scale_inv: Any
    fmt: Format
    block_shape: tuple[int, ...]

    def dequantize(self) -> Any:
        """`data * scale_inv` (per block) in float32, x's shape."""
        return core.blockwise_dequantize_values(self.data, self.scale_inv,
                                                block=self.block_shape,
                                                xp=namespace_of(self.data))


def blockwise_quantize(
    x: Any,
    fmt: Format | str = "e4m3",
    *,
    block_shape: tuple[int, ...] = (1, 128),
    power_of_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> BlockwiseTensor:
    """Quantise `x` to FP8 with one float32 scale per block (formulas in the module header).

    Parameters
    ----------
    x : array_like
        Float array with at least `len(block_shape)` axes (bfloat16 and float16 keep their
        own overflow value, as TE).
    fmt : Format or str, optional
        `"e4m3"` (default) or `"e5m2"`, or any Format.
    block_shape : tuple of int, optional
        `(r, c)` tiles of the last two axes (`(1, 128)` activations and gradients,
        `(128, 128)` weights) or `(c,)` runs of the last axis. Default `(1, 128)`.
    power_of_2_scales : bool, optional
        Round each scale down to a power of two (exact rescaling). Default False.
    amax_epsilon : float, optional
        Lower bound (>= 0) on each block's amax. Default 0.

    Returns
    -------
    t : BlockwiseTensor
        Data, scales and decode scales.

    Raises
    ------
    TypeError
        Non-float `x`, a non-bool flag.
    ValueError
        A bad format, block shape or epsilon.

    Examples
    --------
    >>> x = np.array([[3.0, 0.25], [-1.0, 0.0]], np.float32)  # one 2 x 2 block, amax 3
    >>> t = blockwise_quantize(x, block_shape=(2, 2), power_of_2_scales=True)
    >>> t.scales.tolist(), t.data.tolist()   # 448 / 3 = 149.3 -> 128 (power of two)
    ([[128.0]], [[384.0, 32.0], [-128.0, 0.0]])
    """
    arr = as_float_array(x, "x", min_ndim=1)
    return blockwise_tensor(arr, get_format(fmt), block_shape, power_of_2_scales, amax_epsilon,
                            xp=NUMPY)


def blockwise_tensor(x: Any, fmt: Format, block_shape: Any, power_of_2_scales: Any,
                     amax_epsilon: Any, *, xp: ArrayNamespace) -> BlockwiseTensor:
    """[blockwise_quantize][normlab.precision.blockwise_quantize] of an array of `xp` (a
    NumPy array or a tensor) whose type the caller checked: the remaining checks, then the
    shared steps."""
    block = check_block_shape(block_shape, len(x.shape))
    eps = check_amax_epsilon(amax_epsilon)
    pow2 = check_bool(power_of_2_scales, "power_of_2_scales")
    data, scales, inv = core.blockwise_quantize_parts(
        x, fmt, block=block, epsilon=eps, power_of_2_scales=pow2, xp=xp)
    return BlockwiseTensor(data, scales, inv, fmt, block)
