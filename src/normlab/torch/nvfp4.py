"""NVFP4 on tensors: E2M1 elements, E4M3 scales per block of 16, one float32 tensor scale.

Dimension letters: N the blocked axis (1-D blocks), R, C the last two axes (2-D blocks).

Contract: :func:`normlab.precision.nvfp4_quantize` bit for bit, on any device, in float32
as Transformer Engine's cast: ``S_enc = min(float32(2688 / amax_t), FLT_MAX)`` (1 when
amax_t is 0, inf or NaN, or the quotient is 0), ``S_dec = float32(1 / S_enc)``; block
scales ``s_b = e4m3_sat(amax_b * float32(S_enc * float32(1/6)))``; element scales
``e_b = min(float32(1 / float32(s_b * S_dec)), FLT_MAX)``; elements ``e2m1_sat(x * e_b)``
rounded to nearest or stochastically (element i of x's flattened C order uses
``splitmix64(seed + i)``, as :func:`normlab.torch.quantize`). NVIDIA, "Pretraining Large
Language Models with NVFP4", 2025, sec. 2 and app. B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import check_finite_real, check_int
from normlab.precision._blocks import check_block_shape
from normlab.precision.formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN
from normlab.torch import _blocks
from normlab.torch._fastround import round_elements
from normlab.torch._import import torch
from normlab.torch.quantize import _check_tensor, quantize

__all__ = ["NVFP4Tensor", "nvfp4_fake_quantize", "nvfp4_quantize"]

_F32_MAX = float(np.finfo(np.float32).max)
_SIXTH = float(np.float32(1.0 / 6.0))
_MODES = ("nearest", "stochastic")


@dataclass(frozen=True)
class NVFP4Tensor:
    """NVFP4 tensor: ``elements`` (float32 E2M1 values, x's shape), ``block_scales``
    (float32 E4M3 values per block), ``tensor_scale`` (0-d float32 S_dec)."""

    elements: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    block_shape: tuple[int, ...]
    axis: int

    def dequantize(self) -> torch.Tensor:
        """``elements * block_scale * tensor_scale`` in float32, x's shape."""
        moved = self.elements.movedim(self.axis, -1)
        bs = (self.block_scales.movedim(self.axis, -1) if len(self.block_shape) == 1
              else self.block_scales)
        scales = _blocks.expand(bs, self.block_shape, tuple(moved.shape))
        return ((moved * scales) * self.tensor_scale).movedim(-1, self.axis)


def _tensor_scales(amax_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec) as 0-d float32 tensors from the tensor amax."""
    a = amax_t.to(torch.float32)
    # tensor / tensor: a Python number on the left would be reciprocal-then-multiply
    s_enc = torch.full_like(a, 448.0 * 6.0) / a
    ok = (a > 0) & (a < float("inf")) & (s_enc != 0)  # finite, nonzero; NaN fails both
    s_enc = torch.clamp(torch.where(ok, s_enc, 1.0), max=_F32_MAX)
    return s_enc, torch.ones_like(s_enc) / s_enc


def _block_amax(t: torch.Tensor, ax: int, block: tuple[int, ...]) -> torch.Tensor:
    """max |t| per block in float32 on the block grid (``...,nB`` with the blocked axis
    last for 1-D blocks, ``...,nR,nC`` for 2-D), as ``_blocks.block_amax`` of the moved
    tensor. Read in t's own layout and dtype when the blocks tile it (a max of magnitudes is
    exact in any dtype, and its float32 rounding is the rounding of the float64 max)."""
    x = t.detach()
    if len(block) == 1:
        n, k = x.shape[ax], block[0]
        if n % k:
            return _blocks.block_amax(x.movedim(ax, -1), block).to(torch.float32)
        tiles = x.abs().reshape(*x.shape[:ax], n // k, k, *x.shape[ax + 1:])
        # abs again: a reduction may hand back a NaN with its sign set (NumPy's is +NaN)
        return tiles.amax(dim=ax + 1).abs().movedim(ax, -1).to(torch.float32)  # ...,nB
    (R, C), (r, c) = x.shape[-2:], block
    if R % r or C % c:
        return _blocks.block_amax(x, block).to(torch.float32)
    tiles = x.abs().reshape(*x.shape[:-2], R // r, r, C // c, c)
    return tiles.amax(dim=(-3, -1)).abs().to(torch.float32)  # ...,nR,nC


def _spread(v: torch.Tensor, ax: int, block: tuple[int, ...],
            shape: tuple[int, ...]) -> torch.Tensor:
    """Per-block values on the block grid (see :func:`_block_amax`) over every element, in
    x's layout (contiguous): one copy instead of a repeat per blocked axis."""
    if len(block) == 1:
        g = v.movedim(-1, ax)  # the block index at ax
        k, n = block[0], shape[ax]
        full = g.unsqueeze(ax + 1).expand(*g.shape[: ax + 1], k, *g.shape[ax + 1:])
        full = full.reshape(*g.shape[:ax], -1, *g.shape[ax + 1:])
        return full if full.shape[ax] == n else full.narrow(ax, 0, n).contiguous()
    (nR, nC), (r, c), (R, C) = v.shape[-2:], block, shape[-2:]
    full = v[..., :, None, :, None].expand(*v.shape[:-2], nR, r, nC, c)
    full = full.reshape(*v.shape[:-2], nR * r, nC * c)
    return full if (nR * r, nC * c) == (R, C) else full[..., :R, :C].contiguous()


def _checked(t: Any, axis: Any, block_shape: Any, rounding: Any,
             tensor_amax: Any) -> tuple[torch.Tensor, int, tuple[int, ...], torch.Tensor]:
    """Validated (t, axis in [0, t.dim()), block, tensor amax as a 0-d float64 tensor)."""
    t = _check_tensor(t)
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
    if tensor_amax is None:
        amax_t = (t.detach().abs().amax().to(torch.float64) if t.numel()
                  else torch.zeros((), dtype=torch.float64, device=t.device))
    elif isinstance(tensor_amax, torch.Tensor):
        amax_t = tensor_amax.detach().reshape(()).to(device=t.device, dtype=torch.float64)
    else:
        v = check_finite_real(tensor_amax, "tensor_amax")
        if v < 0:
            raise ValueError(f"tensor_amax must be >= 0; got {tensor_amax!r}")
        amax_t = torch.tensor(v, dtype=torch.float64, device=t.device)
    return t, ax % t.dim(), block, amax_t


def _parts(
    t: torch.Tensor, ax: int, block: tuple[int, ...], rounding: str, amax_t: torch.Tensor,
    seed: int | None, random_bits: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(elements in x's layout and work dtype, block scales on the grid, S_dec)."""
    s_enc, s_dec = _tensor_scales(amax_t)
    s_b = _block_amax(t, ax, block) * (s_enc * _SIXTH)  # TE's order: amax_b * f32(S_enc/6)
    scales = round_elements(s_b, FLOAT8_E4M3FN, saturate=True)  # == quantize, faster
    inv = torch.clamp(torch.div(torch.ones_like(scales), scales * s_dec), max=_F32_MAX)
    work = _blocks.work_dtype(t)
    scaled = t.detach().to(work) * _spread(inv, ax, block, tuple(t.shape)).to(work)  # x's
    # layout, contiguous: element i is x's flat index i (its stochastic word)
    if rounding == "nearest" and seed is None and random_bits is None:
        elems = round_elements(scaled, FLOAT4_E2M1FN, saturate=True)  # == quantize, faster
    else:
        elems = quantize(scaled, FLOAT4_E2M1FN, rounding=rounding, saturate=True, seed=seed,
                         random_bits=random_bits)
    return elems, scales, s_dec


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
    elems, scales, s_dec = _parts(t, ax, block, rounding, amax_t, seed, random_bits)
    stored = scales if len(block) == 2 else scales.movedim(-1, ax)
    return NVFP4Tensor(elems.to(torch.float32), stored, s_dec, block, ax)


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
    elems, scales, s_dec = _parts(t, ax, block, rounding, amax_t, seed, random_bits)
    return (elems.to(torch.float32) * _spread(scales, ax, block, tuple(t.shape))) * s_dec
