r"""NVFP4 on tensors: E2M1 elements, E4M3 scales per block of 16, one float32 tensor scale.

Dimension letters: N the blocked axis (1-D blocks), R, C the last two axes (2-D blocks).

Contract: [normlab.precision.nvfp4_quantize][] bit for bit, on any device, because both
run [nvfp4_quantize_parts][normlab.precision.recipe_core.nvfp4_quantize_parts] (the
two-level scales of [nvfp4_scales][normlab.precision.block_scales.nvfp4_scales], in
float32 as Transformer Engine's cast) through their array namespace; elements are rounded
to nearest or stochastically (element i of x's flattened C order uses
`splitmix64(seed + i)`, as [normlab.torch.quantize][]). This module validates arguments
and holds tensors. NVIDIA, "Pretraining Large Language Models with NVFP4", 2025, sec. 2
and app. B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab._validate import check_finite_real, check_int
from normlab.precision import recipe_core as core
from normlab.precision.blocks import check_block_shape
from normlab.torch._import import torch
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["NVFP4Tensor", "nvfp4_fake_quantize", "nvfp4_quantize"]

_MODES = ("nearest", "stochastic")


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantised tensor.

    Attributes
    ----------
    elements : torch.Tensor
        float32 E2M1 values, x's shape (NaN in NaN blocks).
    block_scales : torch.Tensor
        float32 E4M3 values, one per block (the NumPy twin's layout).
    tensor_scale : torch.Tensor
        0-d float32, $S_{dec}$.
    block_shape : tuple of int
        `(16,)` or the 2-D block shape.
    axis : int
        The blocked axis of 1-D blocks (non-negative).
    """

    elements: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    block_shape: tuple[int, ...]
    axis: int

    def dequantize(self) -> torch.Tensor:
        """`elements * block_scale * tensor_scale` in float32, x's shape."""
        return core.nvfp4_dequantize_values(self.elements, self.block_scales,
                                            self.tensor_scale, block=self.block_shape,
                                            axis=self.axis, xp=TORCH)


def _checked(t: Any, axis: Any, block_shape: Any, rounding: Any,
             tensor_amax: Any) -> tuple[torch.Tensor, int, tuple[int, ...], torch.Tensor | None]:
    """Validated (t, axis in [0, t.dim()), block, tensor amax as a 0-d float64 tensor or
    None for max |t|)."""
    t = check_tensor(t)
    if t.dim() < 1:
        raise ValueError(f"t must have at least one dimension; got shape {tuple(t.shape)}")
    ax = check_int(axis, "axis")
    if not -t.dim() <= ax < t.dim():
        raise ValueError(f"axis must be in [-{t.dim()}, {t.dim()}); got {axis}")
    if block_shape is None:
        block: tuple[int, ...] = (16,)
    else:
        block = check_block_shape(block_shape, t.dim())
        if len(block) != 2 or ax % t.dim() != t.dim() - 1:
            raise ValueError("block_shape must be None (1 x 16 blocks along axis) or a 2-tuple "
                             f"of the last two axes with axis=-1; got block_shape="
                             f"{block_shape!r}, axis={axis}")
    if rounding not in _MODES:
        raise ValueError(f"rounding must be one of {_MODES}; got {rounding!r}")
    amax_t: torch.Tensor | None = None  # None: max |t|
    if isinstance(tensor_amax, torch.Tensor):
        amax_t = tensor_amax.detach().reshape(()).to(device=t.device, dtype=torch.float64)
    elif tensor_amax is not None:
        v = check_finite_real(tensor_amax, "tensor_amax")
        if v < 0:
            raise ValueError(f"tensor_amax must be >= 0; got {tensor_amax!r}")
        amax_t = torch.tensor(v, dtype=torch.float64, device=t.device)
    return t, ax % t.dim(), block, amax_t


def nvfp4_quantize(
    t: torch.Tensor,
    *,
    axis: int = -1,
    block_shape: tuple[int, int] | None = None,
    rounding: str = "nearest",
    tensor_amax: Any = None,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> NVFP4Tensor:
    """Quantise ``t`` to NVFP4 (two-level scaling; formulas in the module header).

    Parameters
    ----------
    t : Tensor, at least 1-D (2-D for ``block_shape=(16, 16)``)
    axis : the blocked axis of 1-D blocks (-1 with 2-D blocks)
    block_shape : None (1 x 16 along ``axis``) or a 2-tuple such as (16, 16)
    rounding : "nearest" or "stochastic" (elements; scales are always nearest)
    tensor_amax : float >= 0 or 0-d tensor, optional (e.g. all-reduced over ranks)
    seed, random_bits : randomness for "stochastic" (exactly one; see ``quantize``)

    Returns
    -------
    NVFP4Tensor on t's device, equal to the NumPy twin bit for bit.

    Raises
    ------
    TypeError / ValueError: as the NumPy twin.

    Example
    -------
    >>> q = nvfp4_quantize(torch.arange(16.0) / 2)
    >>> q.block_scales.tolist(), q.elements[:4].tolist()
    ([448.0], [0.0, 0.5, 1.0, 1.0])
    """
    t, ax, block, amax_t = _checked(t, axis, block_shape, rounding, tensor_amax)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        t.detach(), block=block, axis=ax, amax_tensor=amax_t, rounding=rounding, seed=seed,
        random_bits=random_bits, xp=TORCH)
    return NVFP4Tensor(elems, scales, s_dec, block, ax)


def nvfp4_fake_quantize(
    t: torch.Tensor,
    *,
    axis: int = -1,
    block_shape: tuple[int, int] | None = None,
    rounding: str = "nearest",
    tensor_amax: Any = None,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """``nvfp4_quantize(t, ...).dequantize()``, bit for bit, without building the container.

    Formula: ``e2m1(x * e_b) * s_b * S_dec`` elementwise, in float32 (the product order of
    :meth:`NVFP4Tensor.dequantize`). Parameters, errors: as :func:`nvfp4_quantize`.

    Returns
    -------
    Tensor of float32, t's shape and device.

    Example
    -------
    >>> x = torch.linspace(-3.0, 3.0, 32)
    >>> torch.equal(nvfp4_fake_quantize(x), nvfp4_quantize(x).dequantize())
    True
    """
    t, ax, block, amax_t = _checked(t, axis, block_shape, rounding, tensor_amax)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        t.detach(), block=block, axis=ax, amax_tensor=amax_t, rounding=rounding, seed=seed,
        random_bits=random_bits, xp=TORCH)
    return core.nvfp4_dequantize_values(elems, scales, s_dec, block=block, axis=ax, xp=TORCH)
