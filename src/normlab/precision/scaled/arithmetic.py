"""The quantise and dequantise steps of each scaled recipe, written once for every backend.

Dimension letters: N the blocked axis' length, B = ceil(N / k) blocks of k elements,
`...` the other axes.

These are the bodies behind the public recipe functions: the NumPy ones in
[normlab.precision][] validate their arguments and wrap these results in their tensor
classes, the torch twins in `normlab.torch` do the same on tensors, and the training
layer `QuantLinear` dequantises them directly. Arguments are validated already; arrays
come with their namespace `xp` ([normlab.precision.scaled.namespace][]). The scale arithmetic is
[normlab.precision.scaled.scales][] and [normlab.precision.scaled.block_scales][], the tiling
[normlab.precision.scaled.tiling][]; element rounding is the backend's exact engine
(`xp.quantize`). Products `x * scale` are formed in x's work dtype: float64 for float64
input, float32 otherwise (16-bit inputs widen exactly).
"""

from __future__ import annotations

import math
from typing import Any

from normlab.precision.formats.format import FLOAT4_E2M1FN, Format
from normlab.precision.scaled import block_scales, scales
from normlab.precision.scaled import tiling as blocks
from normlab.precision.scaled.block_scales import MX_NAN_CODE
from normlab.precision.scaled.namespace import ArrayNamespace, namespace_of

__all__ = [
    "axis_amax",
    "blockwise_dequantize_values",
    "blockwise_quantize_parts",
    "current_scale",
    "e8m0_values",
    "mx_dequantize_values",
    "mx_quantize_parts",
    "nvfp4_dequantize_values",
    "nvfp4_quantize_parts",
    "per_tensor_quantize",
    "tensor_amax",
]


def tensor_amax(x: Any, *, xp: ArrayNamespace) -> Any:
    """max |x| as a 0-d array of x's work dtype (NaN if x holds one; 0 when x is empty).

    On NumPy arrays the numba kernel `"tensor_amax"` serves 2-D float32 and bfloat16
    operands in one read-only pass (the same value: a max is one of the inputs)."""
    return xp.dispatch("tensor_amax", _tensor_amax_reference, x)


def _tensor_amax_reference(x: Any) -> Any:
    xp = namespace_of(x)
    work = xp.work(x)
    if math.prod(x.shape) == 0:
        return xp.full((), 0.0, work)
    return xp.abs(xp.max(xp.abs(xp.reshape(work, (-1,))), axis=0))


def per_tensor_quantize(x: Any, fmt: Format, scale: Any, *,
                        xp: ArrayNamespace) -> tuple[Any, Any]:
    """FP8 with one scale: `(data, scale_inv)`, `data = sat_round(x * scale)` (float32),
    `scale_inv = float32(1 / scale)`; `scale` is a positive float32 0-d array."""
    with xp.quiet():
        work = xp.work(x)
        s = xp.astype(scale, "float32")
        data = xp.quantize(work * xp.cast_like(s, work), fmt, saturate=True)
        return xp.astype(data, "float32"), xp.scalar(1.0, s) / s


def axis_amax(x: Any, axis: int, *, xp: ArrayNamespace) -> Any:
    """max |x| along `axis`, kept as a size-1 axis, in x's work dtype (NaN wins; 0 along
    an empty axis)."""
    shape = list(x.shape)
    shape[axis] = 1
    work = xp.work(x)
    if x.shape[axis] == 0:
        return xp.full(tuple(shape), 0.0, work)
    return xp.reshape(xp.max(xp.abs(work), axis), tuple(shape))


def current_scale(x: Any, fmt: Format, *, margin: int = 0, epsilon: float = 0.0,
                  power_of_2_scales: bool = False, amax: Any = None, axis: int | None = None,
                  xp: ArrayNamespace) -> Any:
    """Current scaling's float32 scale from max |x| (or the given `amax`, e.g. reduced
    over ranks; per slice along `axis` when it is given):
    [scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] with `fmt.max`, 1 where
    the amax is 0, inf or NaN."""
    if amax is None:
        amax = tensor_amax(x, xp=xp) if axis is None else axis_amax(x, axis, xp=xp)
    a = amax
    return scales.scale_from_amax(a, fmt.max, margin=margin, epsilon=epsilon,
                           power_of_2_scales=power_of_2_scales, xp=xp)


def _pow2(k: Any, xp: ArrayNamespace) -> Any:
    """2^k as float64 for integer k in [-1022, 1023] (exact, from the bits)."""
    return xp.from_bits64((xp.astype(k, "int64") + 1023) << 52)


def mx_quantize_parts(x: Any, fmt: Format, *, block_size: int, axis: int, rule: str,
                      xp: ArrayNamespace) -> tuple[Any, Any]:
    """MX: `(elements, codes)` with blocks of `block_size` along `axis` (zero-padded).

    `codes` (int32, x's shape with the axis length replaced by B) are
    [mx_scale_codes][normlab.precision.scaled.block_scales.mx_scale_codes];
    `elements = sat_round(x / 2^(code - 127))` in `fmt` (float32, x's shape; the
    division is an exact power-of-two product), all NaN in a block whose code is 255.
    """
    with xp.quiet():
        block = (block_size,)
        moved = xp.moveaxis(x, axis, -1)  # ...,N
        work = xp.work(moved)
        amax = blocks.block_amax(moved, block, xp=xp)  # ...,B
        codes = block_scales.mx_scale_codes(amax, fmt, rule, xp=xp)
        bad = codes == MX_NAN_CODE  # ...,B
        factor = xp.cast_like(_pow2(xp.where(bad, xp.scalar(0, codes), 127 - codes), xp),
                              work)
        scaled = blocks.scale_blocks(work, factor, block, xp=xp)  # ...,N
        elems = xp.astype(xp.quantize(scaled, fmt, saturate=True), "float32")
        nan_block = blocks.spread(bad, block, tuple(moved.shape), xp=xp)
        elems = xp.where(nan_block, xp.scalar(float("nan"), elems), elems)
        return xp.moveaxis(elems, -1, axis), xp.moveaxis(codes, -1, axis)


def e8m0_values(codes: Any, *, xp: ArrayNamespace) -> Any:
    """E8M0 codes -> float32 $2^{code - 127}$ (code 255: NaN; code 0: $2^{-127}$ exactly)."""
    with xp.quiet():
        c = xp.astype(codes, "int64")
        out = xp.astype(_pow2(c - 127, xp), "float32")
        return xp.where(c == MX_NAN_CODE, xp.scalar(float("nan"), out), out)


def mx_dequantize_values(elements: Any, codes: Any, *, block_size: int, axis: int,
                         xp: ArrayNamespace) -> Any:
    """`elements * 2^(code - 127)` per block in float32 (NaN for code 255; a product
    beyond float32's range is inf)."""
    with xp.quiet():
        moved = xp.moveaxis(elements, axis, -1)  # ...,N
        c = blocks.spread(xp.astype(xp.moveaxis(codes, axis, -1), "int64"), (block_size,),
                          tuple(moved.shape), xp=xp)  # ...,N
        out = xp.astype(xp.astype(moved, "float64") * _pow2(c - 127, xp), "float32")
        out = xp.where(c == MX_NAN_CODE, xp.scalar(float("nan"), out), out)
        return xp.moveaxis(out, -1, axis)


def nvfp4_quantize_parts(x: Any, *, block: tuple[int, ...], axis: int,
                         amax_tensor: Any = None, rounding: str = "nearest",
                         seed: int | None = None, random_bits: Any = None,
                         xp: ArrayNamespace) -> tuple[Any, Any, Any]:
    """NVFP4: `(elements, block_scales, s_dec)` (scales of
    [nvfp4_scales][normlab.precision.scaled.block_scales.nvfp4_scales]).

    1-D blocks `(16,)` run along `axis`; 2-D blocks tile the last two axes (`axis` is -1).
    `elements = e2m1_sat(x * e_b)` (float32, x's shape), rounded to nearest or
    stochastically (element i of x's flattened C order takes the random word of
    `seed + i`, or `random_bits[i]`), all NaN in a block holding a NaN. `block_scales`
    has x's shape with the blocked axis length replaced by nB (1-D blocks) or the last two
    by (nR, nC); `amax_tensor` defaults to max |x|.
    """
    with xp.quiet():
        moved = xp.moveaxis(x, axis, -1)  # ...,N
        amax_b = xp.astype(blocks.block_amax(moved, block, xp=xp), "float32")  # grid
        if amax_tensor is None:  # the max of the block maxima (NaN propagates)
            amax_tensor = tensor_amax(amax_b, xp=xp)
        s_b, inv, s_dec = block_scales.nvfp4_scales(amax_b, amax_tensor, xp=xp)
        work = xp.work(moved)
        scaled = blocks.scale_blocks(work, xp.cast_like(inv, work), block, xp=xp)  # ...,N
        nan_block = blocks.spread(xp.isnan(s_b), block, tuple(moved.shape), xp=xp)
        # x's layout before rounding: element i of x is stochastic word i
        elems = xp.quantize(xp.moveaxis(scaled, -1, axis), FLOAT4_E2M1FN, saturate=True,
                            rounding=rounding, seed=seed, random_bits=random_bits)
        elems = xp.astype(elems, "float32")
        nan = xp.scalar(float("nan"), elems)
        elems = xp.where(xp.moveaxis(nan_block, -1, axis), nan, elems)
        stored = s_b if len(block) == 2 else xp.moveaxis(s_b, -1, axis)
        return elems, stored, s_dec


def nvfp4_dequantize_values(elements: Any, block_scales: Any, s_dec: Any, *,
                            block: tuple[int, ...], axis: int, xp: ArrayNamespace) -> Any:
    """`(elements * s_b) * S_dec` in float32, x's shape (`elements * s_b` is exact)."""
    with xp.quiet():
        moved = xp.moveaxis(elements, axis, -1)
        grid = block_scales if len(block) == 2 else xp.moveaxis(block_scales, axis, -1)
        s = blocks.spread(grid, block, tuple(moved.shape), xp=xp)
        return xp.moveaxis((moved * s) * xp.astype(s_dec, "float32"), -1, axis)


def blockwise_quantize_parts(x: Any, fmt: Format, *, block: tuple[int, ...],
                             epsilon: float = 0.0, power_of_2_scales: bool = False,
                             nonfinite_nan: bool = False,
                             xp: ArrayNamespace) -> tuple[Any, Any, Any]:
    """Blockwise FP8: `(data, scales, scale_inv)` for blocks tiling x's trailing axes.

    `scales` ([blockwise_scales][normlab.precision.scaled.block_scales.blockwise_scales], with
    x's dtype's max for an overflowing quotient; NaN for a non-finite amax with
    `nonfinite_nan`) and `scale_inv = float32(1 / scale)` are on the block grid;
    `data = sat_round(x * scale)` (float32, x's shape).
    """
    with xp.quiet():
        s = block_scales.blockwise_scales(blocks.block_amax(x, block, xp=xp), fmt,
                                          epsilon=epsilon, power_of_2_scales=power_of_2_scales,
                                          value_for_inf=xp.input_max(x),
                                          nonfinite_nan=nonfinite_nan, xp=xp)
        inv = xp.scalar(1.0, s) / s
        work = xp.work(x)
        scaled = blocks.scale_blocks(work, xp.cast_like(s, work), block, xp=xp)
        data = xp.astype(xp.quantize(scaled, fmt, saturate=True), "float32")
        if nonfinite_nan:  # a NaN-scaled block is the positive quiet NaN throughout (the
            # sign of NaN * NaN is the hardware's choice; the kernels' is the scale's)
            nan = blocks.spread(xp.isnan(s), block, tuple(data.shape), xp=xp)
            data = xp.where(nan, xp.scalar(float("nan"), data), data)
        return data, s, inv


def blockwise_dequantize_values(data: Any, scale_inv: Any, *, block: tuple[int, ...],
                                xp: ArrayNamespace) -> Any:
    """`data * scale_inv` per block in float32, x's shape (inf beyond float32's range)."""
    with xp.quiet():
        return data * blocks.spread(scale_inv, block, tuple(data.shape), xp=xp)
