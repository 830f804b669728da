"""Fake quantisation of one GEMM operand: the values a low-precision GEMM would multiply.

Contract: every function takes a 2-D float32 tensor and returns a float32 tensor of the same
shape holding ``dequantize(quantize(t))``, blocks along ``axis`` (the GEMM's contraction
dimension). Elements are rounded by :func:`round_elements` (normlab's exact rounding); scales are
computed in float32 as the NumPy recipes of :mod:`normlab.precision` do. Dimension letters:
R rows, C columns, B blocks, K block size.
"""

from __future__ import annotations

import numpy as np
import torch

from normlab.precision.formats import Format
from normlab.torch._fastround import round_elements
from normlab.torch.nvfp4 import nvfp4_fake_quantize

__all__ = [
    "block_scaled",
    "hadamard_rows",
    "mx_blocks",
    "nvfp4",
    "per_tensor",
    "round_elements",
]

_F32_MAX = float(np.finfo(np.float32).max)


def scale_from_amax(amax: torch.Tensor, fmt_max: float, margin: int = 0,
                    previous: torch.Tensor | None = None) -> torch.Tensor:
    """``float32(fmt_max / amax / 2^margin)``; ``previous`` (or 1) where amax is 0/inf/NaN.

    The rule of :func:`normlab.precision.compute_scale`, elementwise on a tensor of amaxes;
    a scale that overflows float32 becomes float32's max.
    """
    a = amax.to(torch.float32)
    s = torch.ldexp(torch.tensor(fmt_max, dtype=torch.float32, device=a.device) / a,
                    torch.tensor(-int(margin), device=a.device)).to(torch.float32)
    s = torch.where(torch.isinf(s), torch.full_like(s, _F32_MAX), s)
    keep = previous if previous is not None else torch.ones_like(s)
    good = torch.isfinite(a) & (a > 0)
    return torch.where(good, s, keep.to(torch.float32))


def per_tensor(t: torch.Tensor, fmt: Format, scale: torch.Tensor) -> torch.Tensor:
    """``sat_round(t * scale) / scale`` with one float32 scale (a 0-d tensor)."""
    scaled = t * scale  # float32, as fp8_quantize forms it
    q = round_elements(scaled, fmt, saturate=True)
    scale_inv = (1.0 / scale).to(torch.float32)  # float32(1 / scale), as Fp8Tensor
    return q * scale_inv


def _blocked(t: torch.Tensor, axis: int, k: int) -> tuple[torch.Tensor, int]:
    """Move ``axis`` last, zero-pad it to a multiple of k, reshape to (R, B, K)."""
    moved = t.movedim(axis, -1)  # R,C
    n = moved.shape[-1]
    pad = (-n) % k
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    return moved.reshape(moved.shape[0], -1, k), n  # R,B,K


def _unblocked(blocks: torch.Tensor, n: int, axis: int) -> torch.Tensor:
    out = blocks.reshape(blocks.shape[0], -1)[:, :n]  # R,C
    return out.movedim(-1, axis)


def mx_blocks(t: torch.Tensor, fmt: Format, axis: int, block_size: int = 32) -> torch.Tensor:
    """OCP MX: per block ``e = clamp(floor(log2 amax) - emax_elem, -127, 127)``, elements
    ``sat_round(x / 2^e)`` (exact), value ``elements * 2^e``; a block holding NaN is NaN."""
    b, n = _blocked(t, axis, block_size)  # R,B,K
    amax = b.abs().amax(dim=-1, keepdim=True)  # R,B,1
    _, ex = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    emax_elem = fmt.emax  # floor(log2 fmt.max); a plain int, so torch.compile keeps one graph
    e = torch.where(amax > 0, ex - 1 - emax_elem, torch.full_like(ex, -127)).clamp(-127, 127)
    q = round_elements(torch.ldexp(b, -e), fmt, saturate=True)  # exact power-of-two divide
    return _unblocked(torch.ldexp(q, e), n, axis)


def block_scaled(t: torch.Tensor, fmt: Format, axis: int,
                 block: tuple[int, int]) -> torch.Tensor:
    """Blockwise FP8 (DeepSeek-V3): a float32 scale ``s = fmt_max / amax`` per ``block`` tile,
    value ``sat_round(x * s) * float32(1 / s)`` (:func:`normlab.precision.blockwise_quantize`
    dequantised, bit for bit).

    1-D tiles ``block = (1, K)`` run along ``axis``; 2-D tiles ``(K, K)`` ignore it.
    A tile of zeros stays zero.
    """
    if block[0] == 1:
        b, n = _blocked(t, axis, block[1])  # R,B,K
        amax = b.abs().amax(dim=-1, keepdim=True)  # R,B,1
    else:
        k = block[0]
        rows, cols = t.shape
        pr, pc = (-rows) % k, (-cols) % k
        padded = torch.nn.functional.pad(t, (0, pc, 0, pr))
        b = padded.reshape(padded.shape[0] // k, k, padded.shape[1] // k, k)  # R/K,K,C/K,K
        amax = b.abs().amax(dim=(1, 3), keepdim=True)  # R/K,1,C/K,1
    s = scale_from_amax(amax, fmt.max)
    q = round_elements(b * s, fmt, saturate=True) * (1.0 / s)  # as Fp8Tensor
    if block[0] == 1:
        return _unblocked(q, n, axis)
    return q.reshape(padded.shape)[: t.shape[0], : t.shape[1]]


def nvfp4(t: torch.Tensor, axis: int, *, two_d: bool, seed: int | None) -> torch.Tensor:
    """NVFP4 (NVIDIA 2025): ``nvfp4_quantize(t).dequantize()`` with 1 x 16 blocks along
    ``axis`` (16 x 16 tiles if ``two_d``), stochastic elements when ``seed`` is given.

    Bit-identical to :func:`normlab.precision.nvfp4_quantize` dequantised (same seed).
    """
    return nvfp4_fake_quantize(t, axis=-1 if two_d else axis,
                               block_shape=(16, 16) if two_d else None,
                               rounding="nearest" if seed is None else "stochastic", seed=seed)


def hadamard_rows(t: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Apply ``H D / 4`` (H the 16x16 Sylvester Hadamard matrix, D = diag(signs)) to every
    group of 16 rows (the M dimension, zero-padded to a multiple of 16).

    The map is orthogonal, so for two operands transformed alike ``(Hdy)^T (Hx) = dy^T x``.
    """
    h = torch.ones(1, 1, dtype=torch.float32, device=t.device)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    rot = h * signs.to(t.device, torch.float32)[None, :] / 4.0  # 16,16 orthogonal
    m = t.shape[0]
    padded = torch.nn.functional.pad(t, (0, 0, 0, (-m) % 16))
    groups = padded.reshape(-1, 16, t.shape[1])  # G,16,C
    return torch.matmul(rot, groups).reshape(padded.shape)
