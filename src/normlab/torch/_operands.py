"""Fake quantisation of one GEMM operand: the values a low-precision GEMM would multiply.

Contract: every function takes a 2-D float32 tensor and returns a float32 tensor of the same
shape holding ``dequantize(quantize(t))``, blocks along ``axis`` (the GEMM's contraction
dimension). Elements are rounded by :func:`_round` (normlab's exact rounding); scales are
computed in float32 as the NumPy recipes of :mod:`normlab.precision` do. Dimension letters:
R rows, C columns, B blocks, K block size.
"""

from __future__ import annotations

import numpy as np
import torch

from normlab.precision.formats import FLOAT8_E4M3FN, Format, get_format
from normlab.torch.quantize import quantize

__all__ = [
    "block_scaled",
    "hadamard_rows",
    "mx_blocks",
    "nvfp4",
    "per_tensor",
    "round_elements",
]

_F32_MAX = float(np.finfo(np.float32).max)


_NATIVE = {"bfloat16": torch.bfloat16, "float16": torch.float16,
           "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
# E2M1 magnitudes and the midpoints between neighbours; a tie goes to the even code, which
# is the lower neighbour at 0.25, 1.25, 2.5, 5 and the upper one at 0.75, 1.75, 3.5
_FP4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_TIE_DOWN = (0.25, 1.25, 2.5, 5.0)
_FP4_TIE_UP = (0.75, 1.75, 3.5)


def _fp4_nearest(t: torch.Tensor) -> torch.Tensor:
    """Round to nearest-even E2M1, saturating at 6 (inf too); NaN stays NaN."""
    a = t.abs()
    idx = torch.zeros(t.shape, dtype=torch.int64, device=t.device)
    for b in _FP4_TIE_DOWN:
        idx += a > b
    for b in _FP4_TIE_UP:
        idx += a >= b
    grid = torch.tensor(_FP4_GRID, dtype=t.dtype, device=t.device)
    return _canonical_nan(t, torch.copysign(grid[idx], t))


def _canonical_nan(t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A NaN input gives the quiet NaN 0x7FC00000 with its sign, as ``quantize`` does
    (casts keep payloads)."""
    nan = torch.tensor(torch.nan, dtype=out.dtype, device=out.device)
    return torch.where(torch.isnan(t), torch.copysign(nan, t), out)


def round_elements(t: torch.Tensor, fmt: Format, *, saturate: bool = True,
                   seed: int | None = None) -> torch.Tensor:
    """Round float32 ``t`` to ``fmt`` (nearest even, or stochastic with the stream of ``seed``).

    Bit-identical to :func:`normlab.torch.quantize`; round-to-nearest into bf16, fp16 and
    the two OCP fp8 formats uses PyTorch's native casts (correctly rounded, ties to even;
    saturation by clamping first), E2M1 a comparison ladder, every other case ``quantize``.
    Those shortcuts are about 15x faster on small tensors and are tested against
    ``quantize`` on every bf16-prefix bit pattern and every midpoint of each format.
    """
    if seed is None and t.dtype == torch.float32:
        native = _NATIVE.get(fmt.name)
        if native is not None and (saturate or native in (torch.bfloat16, torch.float16)):
            src = t.clamp(-fmt.max, fmt.max) if saturate else t
            return _canonical_nan(t, src.to(native).to(torch.float32))
        if fmt.name == "float4_e2m1fn" and saturate:
            return _fp4_nearest(t)
    if seed is None:
        return quantize(t, fmt, saturate=saturate)
    return quantize(t, fmt, rounding="stochastic", saturate=saturate, seed=seed)


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
    emax_elem = int(np.frexp(fmt.max)[1]) - 1
    e = torch.where(amax > 0, ex - 1 - emax_elem, torch.full_like(ex, -127)).clamp(-127, 127)
    q = round_elements(torch.ldexp(b, -e), fmt, saturate=True)  # exact power-of-two divide
    return _unblocked(torch.ldexp(q, e), n, axis)


def block_scaled(t: torch.Tensor, fmt: Format, axis: int, block: tuple[int, int],
                 tensor_scale: torch.Tensor | None = None,
                 scale_fmt: Format | None = None, seed: int | None = None) -> torch.Tensor:
    """Block scaling with a float32 (or ``scale_fmt``-rounded) scale per ``block`` tile.

    1-D tiles ``block = (1, K)`` run along ``axis``; 2-D tiles ``(K, K)`` ignore it. The
    decode scale of a tile is ``d = amax / fmt_max`` (times ``tensor_scale`` and rounded to
    ``scale_fmt`` for NVFP4); elements are ``sat_round(x / d)`` and the value ``e * d``.
    Without ``scale_fmt`` the scale is DeepSeek's ``s = fmt_max / amax`` and the value
    ``sat_round(x * s) * float32(1 / s)`` (as :class:`normlab.precision.Fp8Tensor`).
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
    if scale_fmt is None:  # float32 scales
        s = scale_from_amax(amax, fmt.max)
        q = round_elements(b * s, fmt, saturate=True, seed=seed) * (1.0 / s)  # Fp8Tensor
    else:
        assert tensor_scale is not None
        dec = round_elements(amax / fmt.max * tensor_scale, scale_fmt, saturate=True)
        enc = torch.where(dec > 0, tensor_scale / dec, torch.zeros_like(dec))
        q = round_elements(b * enc, fmt, saturate=True, seed=seed)
        q = torch.where(dec > 0, q * dec / tensor_scale, torch.zeros_like(q))
    if block[0] == 1:
        return _unblocked(q, n, axis)
    return q.reshape(padded.shape)[: t.shape[0], : t.shape[1]]


def nvfp4(t: torch.Tensor, axis: int, *, two_d: bool, seed: int | None) -> torch.Tensor:
    """NVFP4 (NVIDIA 2025): tensor scale ``6 * 448 / amax``, E4M3 scale per 16 (or 16x16)."""
    fp4 = get_format("fp4")
    amax = t.abs().amax()
    tensor_scale = scale_from_amax(amax, fp4.max * FLOAT8_E4M3FN.max)
    block = (16, 16) if two_d else (1, 16)
    return block_scaled(t, fp4, axis, block, tensor_scale, FLOAT8_E4M3FN, seed)


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
