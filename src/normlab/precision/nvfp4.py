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
from normlab.precision import recipe_core as core
from normlab.precision.blocks import check_block_shape
from normlab.precision.namespace import NUMPY
from normlab.precision.random_bits import stochastic_source

__all__ = ["NVFP4Tensor", "nvfp4_quantize"]

_MODES = ("nearest", "stochastic")


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantised array.

    Attributes
    ----------
    elements : numpy.ndarray
        float32, x's shape, values of E2M1 (NaN in NaN blocks).
    block_scales : numpy.ndarray
        float32 values of E4M3; x's shape with the blocked axis length replaced by nB
        (1-D blocks), or the last two by (nR, nC) (2-D blocks).
    tensor_scale : float
        The per-tensor decode scale $S_{dec}$ (a float32 value).
    block_shape : tuple of int
        `(16,)` or the 2-D block shape.
    axis : int
        The blocked axis of 1-D blocks (non-negative; the last axis for 2-D blocks).
    """

    elements: np.ndarray
    block_scales: np.ndarray
    tensor_scale: float
    block_shape: tuple[int, ...]
    axis: int

    def dequantize(self) -> np.ndarray:
        """`elements * block_scale * tensor_scale` in float32, x's shape."""
        return core.nvfp4_dequantize_values(self.elements, self.block_scales,
                                            np.float32(self.tensor_scale),
                                            block=self.block_shape, axis=self.axis, xp=NUMPY)


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
        block = check_block_shape(block_shape, arr.ndim)
        if len(block) != 2 or ax % arr.ndim != arr.ndim - 1:
            raise ValueError("block_shape must be None (1 x 16 blocks along axis) or a 2-tuple "
                             f"of the last two axes with axis=-1; got block_shape="
                             f"{block_shape!r}, axis={axis}")
    if rounding not in _MODES:
        raise ValueError(f"rounding must be one of {_MODES}; got {rounding!r}")
    amax_t = None if tensor_amax is None else check_finite_real(tensor_amax, "tensor_amax")
    if amax_t is not None and amax_t < 0:
        raise ValueError(f"tensor_amax must be >= 0; got {tensor_amax!r}")
    seed_, words = stochastic_source(rounding == "stochastic", rng, seed, random_bits,
                                     arr.shape)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        arr, block=block, axis=ax % arr.ndim,
        amax_tensor=None if amax_t is None else np.float64(amax_t), rounding=rounding,
        seed=seed_, random_bits=words, xp=NUMPY)
    return NVFP4Tensor(elems, scales, float(s_dec), block, ax % arr.ndim)
