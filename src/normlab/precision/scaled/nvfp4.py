r"""NVFP4: E2M1 elements, E4M3 scales per block of 16, one float32 scale per tensor.

Dimension letters: N the blocked axis' length (1-D blocks), R, C the last two axes (2-D
blocks); nB = ceil(N / 16) blocks, nR = ceil(R / 16), nC = ceil(C / 16).

Contract (two-level scaling, all arithmetic in float32 as Transformer Engine's cast does;
`transformer_engine/common/util` NVFP4 cast, `compute_global_encode_scaling_factor_FP4`
and `compute_decoding_scaling_factor`; recipe `NVFP4BlockScaling`; NVIDIA, "Pretraining
Large Language Models with NVFP4", 2025, sec. 2 and app. B), computed by
[nvfp4_scales][normlab.precision.scaled.block_scales.nvfp4_scales] and
[nvfp4_quantize_parts][normlab.precision.scaled.arithmetic.nvfp4_quantize_parts], shared with
the torch twin and the training layer:

- tensor encode scale $S_{enc} = (448 \cdot 6) / \mathrm{amax}_t$ ($\mathrm{amax}_t$ =
  max |x|, or `tensor_amax`), at most FLT_MAX, 1 when $\mathrm{amax}_t$ is 0, inf or NaN
  (TE: 0 and inf); $S_{dec} = \mathrm{float32}(1 / S_{enc})$ is the stored `tensor_scale`;
- block decode scale $s_b = \mathrm{e4m3\_sat}(\mathrm{amax}_b \cdot
  \mathrm{float32}(S_{enc} \cdot \mathrm{float32}(1/6)))$ ($\mathrm{amax}_b$ = max |x|
  over the block, round to nearest, saturating to 448): `block_scales`;
- element encode scale $e_b = \min(\mathrm{float32}(1 / \mathrm{float32}(s_b S_{dec})),
  \mathrm{FLT\_MAX})$ (FLT_MAX for a zero block scale), elements
  $q = \mathrm{e2m1\_sat}(x \cdot e_b)$ ($x \cdot e_b$ in float32; in float64 for float64
  input), rounded to nearest even or stochastically;
- `dequantize()` $= (q \cdot s_b) \cdot S_{dec}$ (float32; $q \cdot s_b$ is exact).

Blocks: `block_shape=None` gives 1 x 16 blocks along `axis` (activations, gradients);
`(16, 16)` gives 16 x 16 tiles of the last two axes (the paper's 2-D weight blocks, so
the transposed weight quantises identically); scales are then one per tile. Lengths that
are not multiples of the block are handled by zero padding of the statistics.

Stochastic rounding (the paper's rule for gradients): the element quantisation of x's
flattened C-order element i uses `splitmix64(seed + i)` (as
[quantize][normlab.precision.quantize]), so a twin implementation reproduces it from the
seed. NaN in a block makes its scale and elements NaN (other blocks are unaffected); an
infinity saturates to $\pm 6$ with the scale at most 448.

Differences from torchao's NVFP4 (`torchao.prototype.mx_formats.nvfp4_tensor`,
`NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(amax))`), each
checked with torchao 0.18.0 on torch 2.13 (CPU) against this function:

- torchao clamps every block scale to at least E4M3's smallest normal $2^{-6}$: a tensor of
  amax 2688 with a block of amax 0.03 gets block scales `[448, 0.015625, 0.015625]` there
  (the all-zero third block too) and `[448, 0.005859375, 0]` here (E4M3 subnormals and 0);
  the dequantised block differs (-0.03125 against -0.03515625 for -0.03).
- torchao forms the block scale as $(\mathrm{amax}_b / 6) / p$ with its per-tensor scale
  $p = \mathrm{amax}_t / 2688$, not TE's $\mathrm{amax}_b \cdot (S_{enc} \cdot (1/6))$, so
  the float32 value that E4M3 rounds can sit on the other side of a tie: for
  $\mathrm{amax}_t$ = 1535.953 and a block amax of 106.282455 torchao rounds 31.0 (a tie,
  to even: 32) and normlab 30.999998 (to 30).
- Its per-tensor decode scale is $\mathrm{float32}(\mathrm{amax}_t / 2688)$, not
  $\mathrm{float32}(1 / \mathrm{float32}(2688 / \mathrm{amax}_t))$ (they differed in 568 of
  2000 random 4 x 64 tensors), and it dequantises as $q \cdot (p \cdot s_b)$, not
  $(q \cdot s_b) \cdot S_{dec}$: the dequantised values differed in 1789 of those 2000
  tensors, also where both block scales agree.
- A NaN or an infinity anywhere makes torchao's per-tensor scale NaN or inf and every
  element of the tensor NaN; here only the NaN's block is NaN, and an infinity saturates
  in its own block while the other blocks stay finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_axis, check_finite_real
from normlab.precision.formats.random_bits import stochastic_source
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.namespace import NUMPY, namespace_of
from normlab.precision.scaled.tiling import check_block_shape

__all__ = ["NVFP4Tensor", "nvfp4_quantize"]

_MODES = ("nearest", "stochastic")


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4 array: two levels of scales and E2M1 elements, from
    [nvfp4_quantize][normlab.precision.nvfp4_quantize] or its torch twin (then tensors).

    Attributes
    ----------
    elements : numpy.ndarray or torch.Tensor
        float32, x's shape, values of E2M1 (NaN in NaN blocks).
    block_scales : numpy.ndarray or torch.Tensor
        float32 values of E4M3; x's shape with the blocked axis length replaced by nB
        (1-D blocks), or the last two by (nR, nC) (2-D blocks).
    tensor_scale : float or torch.Tensor
        The per-tensor decode scale $S_{dec}$ (a float32 value; 0-d for tensors).
    block_shape : tuple of int
        `(16,)` or the 2-D block shape.
    axis : int
        The blocked axis of 1-D blocks (non-negative; the last axis for 2-D blocks).
    """

    elements: Any
    block_scales: Any
    tensor_scale: Any
    block_shape: tuple[int, ...]
    axis: int

    def dequantize(self) -> Any:
        """`elements * block_scale * tensor_scale` in float32, x's shape."""
        xp = namespace_of(self.elements)
        s_dec = xp.astype(self.tensor_scale, "float32")
        return core.nvfp4_dequantize_values(self.elements, self.block_scales, s_dec,
                                            block=self.block_shape, axis=self.axis, xp=xp)


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
    """Quantise `x` to NVFP4 (two-level scaling; formulas in the module header).

    Parameters
    ----------
    x : array_like
        Float array, at least 1-D (2-D for `block_shape=(16, 16)`).
    axis : int, optional
        The blocked axis of 1-D blocks (must stay -1 with 2-D blocks). Default -1.
    block_shape : tuple of int or None, optional
        None (1 x 16 along `axis`) or a 2-tuple such as (16, 16) of the last two axes.
    rounding : {"nearest", "stochastic"}, optional
        How the elements round (scales are always nearest). Default `"nearest"`.
    rng : numpy.random.Generator, optional
        Stochastic rounding: draws the seed (see [quantize][normlab.precision.quantize]).
    tensor_amax : float, optional
        The per-tensor amax (>= 0) to use instead of max |x| (e.g. one all-reduced over
        ranks).
    seed : int, optional
        Stochastic rounding: element i of x's C order takes the word of `seed + i`.
    random_bits : numpy.ndarray, optional
        Stochastic rounding: uint64 words of x's shape. Exactly one of `rng`, `seed`,
        `random_bits` for stochastic rounding.

    Returns
    -------
    t : NVFP4Tensor
        Elements, block scales and the tensor scale.

    Raises
    ------
    TypeError
        Non-float `x`, a non-int axis, bad randomness types.
    ValueError
        A bad axis, block shape, rounding, `tensor_amax` or randomness.

    Examples
    --------
    >>> x = np.arange(16, dtype=np.float32) / 2  # amax 7.5: S_enc = 2688 / 7.5 = 358.4
    >>> t = nvfp4_quantize(x)   # block scale e4m3(7.5 / 6 * 358.4) = 448; e_b = 0.8
    >>> t.block_scales.tolist(), t.elements[:8].tolist()  # x * 0.8 on the E2M1 grid
    ([448.0], [0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0])
    >>> float(t.dequantize()[15])   # 6 * 448 / 358.4
    7.5
    """
    arr = as_float_array(x, "x", min_ndim=1)
    ax, block, amax_t = check_nvfp4_args(arr.ndim, axis, block_shape, rounding, tensor_amax)
    seed_, words = stochastic_source(rounding == "stochastic", rng, seed, random_bits,
                                     arr.shape)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        arr, block=block, axis=ax, amax_tensor=None if amax_t is None else np.float64(amax_t),
        rounding=rounding, seed=seed_, random_bits=words, xp=NUMPY)
    return NVFP4Tensor(elems, scales, float(s_dec), block, ax)


def check_nvfp4_args(ndim: int, axis: Any, block_shape: Any, rounding: Any,
                     tensor_amax: Any) -> tuple[int, tuple[int, ...], float | None]:
    """The checks of [nvfp4_quantize][normlab.precision.nvfp4_quantize] shared with its
    torch twin: (axis in [0, ndim), block shape, tensor amax >= 0 or None)."""
    ax = check_axis(axis, ndim)
    if block_shape is None:
        block: tuple[int, ...] = (16,)
    else:
        block = check_block_shape(block_shape, ndim)
        if len(block) != 2 or ax % ndim != ndim - 1:
            raise ValueError("block_shape must be None (1 x 16 blocks along axis) or a 2-tuple "
                             f"of the last two axes with axis=-1; got block_shape="
                             f"{block_shape!r}, axis={axis}")
    if rounding not in _MODES:
        raise ValueError(f"rounding must be one of {_MODES}; got {rounding!r}")
    amax_t = None if tensor_amax is None else check_finite_real(tensor_amax, "tensor_amax")
    if amax_t is not None and amax_t < 0:
        raise ValueError(f"tensor_amax must be >= 0; got {tensor_amax!r}")
    return ax % ndim, block, amax_t
