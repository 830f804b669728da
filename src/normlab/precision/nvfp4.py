"""NVFP4: E2M1 elements, E4M3 scales per block of 16, one float32 scale per tensor.

Dimension letters: N the blocked axis' length (1-D blocks), R, C the last two axes (2-D
blocks); nB = ceil(N / 16) blocks, nR = ceil(R / 16), nC = ceil(C / 16).

Contract (two-level scaling, all arithmetic in float32 as Transformer Engine's cast does;
``transformer_engine/common/util`` NVFP4 cast, ``compute_global_encode_scaling_factor_FP4``
and ``compute_decoding_scaling_factor``; recipe ``NVFP4BlockScaling``; NVIDIA,
"Pretraining Large Language Models with NVFP4", 2025, sec. 2 and app. B):

- tensor encode scale ``S_enc = (448 * 6) / amax_t`` (amax_t = max |x|, or ``tensor_amax``);
  ``min(S_enc, FLT_MAX)``; 1 when amax_t is 0, inf or NaN (TE: 0 and inf); ``S_dec =
  float32(1 / S_enc)`` is the stored ``tensor_scale``;
- block decode scale ``s_b = e4m3_sat(amax_b * float32(S_enc * float32(1/6)))`` (amax_b =
  max |x| over the block, round to nearest, saturating to 448): ``block_scales``;
- element encode scale ``e_b = min(float32(1 / float32(s_b * S_dec)), FLT_MAX)`` (FLT_MAX
  for a zero block scale), elements ``q = e2m1_sat(x * e_b)`` (x * e_b in float32; in
  float64 for float64 input), rounded to nearest even or stochastically;
- ``dequantize() = q * s_b * S_dec`` (float32; q * s_b is exact).

Blocks: ``block_shape=None`` gives 1 x 16 blocks along ``axis`` (activations, gradients);
``(16, 16)`` gives 16 x 16 tiles of the last two axes (the paper's 2-D weight blocks, so
the transposed weight quantises identically); scales are then one per tile. Lengths that
are not multiples of the block are handled by zero padding of the statistics.

Stochastic rounding (the paper's rule for gradients): the element quantisation of x's
flattened C-order element i uses ``splitmix64(seed + i)`` (as :func:`quantize`), so a
twin implementation reproduces it from the seed. NaN in a block makes its scale and
elements NaN; an infinity saturates to +-6 with the scale at most 448.
torchao's ``nvfp4_tensor.py`` differs on zero blocks only (it clamps block scales to
E4M3's smallest normal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real, check_int
from normlab.precision import _blocks
from normlab.precision.formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN
from normlab.precision.rounding import RoundingMode, quantize

__all__ = ["NVFP4Tensor", "nvfp4_quantize"]

_F32 = np.float32
_F32_MAX = _F32(np.finfo(np.float32).max)
_MODES = ("nearest", "stochastic")


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantised array.

    elements: float32, x's shape, values of E2M1 (NaN in NaN blocks).
    block_scales: float32 values of E4M3; x's shape with the blocked axis length replaced
    by nB (1-D blocks), or the last two by (nR, nC) (2-D blocks).
    tensor_scale: the per-tensor decode scale S_dec (a float32 value).
    """

    elements: np.ndarray
    block_scales: np.ndarray
    tensor_scale: float
    block_shape: tuple[int, ...]
    axis: int

    def dequantize(self) -> np.ndarray:
        """``elements * block_scale * tensor_scale`` in float32, x's shape."""
        moved = np.moveaxis(self.elements, self.axis, -1)
        block = self.block_shape
        scales = _blocks.expand(np.moveaxis(self.block_scales, self.axis, -1)
                                if len(block) == 1 else self.block_scales, block, moved.shape)
        with np.errstate(over="ignore", invalid="ignore"):
            out = (moved * scales).astype(np.float32) * _F32(self.tensor_scale)
        return np.moveaxis(out, -1, self.axis)


def _tensor_scales(amax_t: float) -> tuple[np.float32, np.float32]:
    """(S_enc, S_dec) from the tensor amax (see the module header)."""
    a = _F32(amax_t)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = _F32(_F32(448.0 * 6.0) / a)
    if not (np.isfinite(a) and a > 0) or s_enc == 0:
        s_enc = _F32(1.0)
    s_enc = min(s_enc, _F32_MAX)
    return s_enc, _F32(_F32(1.0) / s_enc)


def nvfp4_quantize(
    x: Any,
    *,
    axis: int = -1,
    block_shape: tuple[int, int] | None = None,
    rounding: str = "nearest",
    rng: np.random.Generator | None = None,
    tensor_amax: float | None = None,
    seed: int | None = None,
    random_bits: np.ndarray | None = None,
) -> NVFP4Tensor:
    """Quantise ``x`` to NVFP4 (two-level scaling; formulas in the module header).

    Parameters
    ----------
    x : float array, at least 1-D (2-D for ``block_shape=(16, 16)``)
    axis : int
        The blocked axis of 1-D blocks (must stay -1 with 2-D blocks).
    block_shape : None (1 x 16 along ``axis``) or a 2-tuple such as (16, 16)
    rounding : "nearest" or "stochastic" (the elements; scales are always nearest)
    rng, seed, random_bits : randomness for "stochastic", exactly one (see :func:`quantize`)
    tensor_amax : float >= 0, optional
        The per-tensor amax to use instead of max |x| (e.g. an amax all-reduced over ranks).

    Returns
    -------
    NVFP4Tensor

    Raises
    ------
    TypeError / ValueError: non-float x, bad axis, block shape, rounding, tensor_amax or
    randomness.

    Example
    -------
    >>> x = np.arange(16, dtype=np.float32) / 2  # amax 7.5: S_enc = 2688 / 7.5 = 358.4
    >>> t = nvfp4_quantize(x)   # block scale e4m3(7.5 / 6 * 358.4) = 448; e_b = 0.8
    >>> t.block_scales.tolist(), t.elements[:8].tolist()  # x * 0.8 on the E2M1 grid
    ([448.0], [0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0])
    >>> float(t.dequantize()[15])   # 6 * 448 / 358.4
    7.5
    """
    arr = as_float_array(x, "x", min_ndim=1)
    ax = check_int(axis, "axis")
    if not -arr.ndim <= ax < arr.ndim:
        raise ValueError(f"axis must be in [-{arr.ndim}, {arr.ndim}); got {axis}")
    if block_shape is None:
        block: tuple[int, ...] = (16,)
    else:
        block = _blocks.check_block_shape(block_shape, arr.ndim)
        if len(block) != 2 or ax % arr.ndim != arr.ndim - 1:
            raise ValueError("block_shape must be None (1 x 16 blocks along axis) or a 2-tuple "
                             f"of the last two axes with axis=-1; got block_shape="
                             f"{block_shape!r}, axis={axis}")
    if rounding not in _MODES:
        raise ValueError(f"rounding must be one of {_MODES}; got {rounding!r}")
    amax_t = None if tensor_amax is None else check_finite_real(tensor_amax, "tensor_amax")
    if amax_t is not None and amax_t < 0:
        raise ValueError(f"tensor_amax must be >= 0; got {tensor_amax!r}")
    ax %= arr.ndim
    moved = np.moveaxis(arr, ax, -1)  # ...,N
    with np.errstate(invalid="ignore"):
        amax_raw = _blocks.block_amax(moved, block)  # block grid, exact
    if amax_t is None:  # max |x| = the max of the block maxima (NaN propagates)
        amax_t = float(np.max(amax_raw)) if amax_raw.size else 0.0
    s_enc, s_dec = _tensor_scales(amax_t)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        amax_b = amax_raw.astype(np.float32)
        # TE's operation order (core_nvfp4.cuh, compute_decoding_scaling_factor):
        # amax_b * (S_enc * (1/6)), each product rounded to float32
        s_b = (amax_b * _F32(s_enc * _F32(1.0 / 6.0))).astype(np.float32)
        scales = quantize(s_b, FLOAT8_E4M3FN, saturate=True)  # block grid, float32
        inv = np.minimum(_F32(1.0) / (scales * s_dec).astype(np.float32), _F32_MAX)
        work = _blocks.work_dtype(arr)
        moved_w = moved.astype(work, copy=False)  # ...,N
        scaled = np.moveaxis(_blocks.multiply_blocks(moved_w, inv.astype(work), block), -1, ax)
        elems = quantize(scaled, FLOAT4_E2M1FN, rounding=RoundingMode(rounding),
                         saturate=True, rng=rng, seed=seed, random_bits=random_bits)
    stored = scales if len(block) == 2 else np.moveaxis(scales, -1, ax)
    return NVFP4Tensor(elems.astype(np.float32, copy=False), stored, float(s_dec), block, ax)
