"""Block tiling on tensors for the block-scaled recipes (NVFP4, blockwise FP8).

Dimension letters: A the leading axes flattened, R and C the blocked axes' lengths, r x c
a block, nR = ceil(R / r), nC = ceil(C / c). The torch twin of
``normlab.precision._blocks``: ``(c,)`` blocks the last axis in runs of c, ``(r, c)`` the
last two axes in tiles; padding with zeros (which change no amax) for the statistics only.
"""

from __future__ import annotations

import math

from normlab.torch._import import torch

__all__ = ["block_amax", "expand", "work_dtype"]


def work_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 input, else float32 (bf16/fp16 widen exactly)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def block_amax(x: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """max |x| over each block in float64 (NaN if the block holds one).

    Returns shape ``lead + (nR, nC)`` for 2-D blocks, ``lead + (nC,)`` for 1-D.
    """
    full = block if len(block) == 2 else (1, block[0])
    lead = tuple(x.shape[: x.dim() - len(block)])
    tail = tuple(x.shape[x.dim() - len(block):])
    R, C = tail if len(tail) == 2 else (1, tail[0])
    r, c = full
    nR, nC = -(-R // r), -(-C // c)
    a = x.detach().to(torch.float64).abs().reshape(math.prod(lead), R, C)  # A,R,C
    a = torch.nn.functional.pad(a, (0, nC * c - C, 0, nR * r - R))
    m = a.reshape(a.shape[0], nR, r, nC, c).amax(dim=(2, 4))  # A,nR,nC (NaN propagates)
    return m.reshape(*lead, nR, nC) if len(block) == 2 else m.reshape(*lead, nC)


def expand(values: torch.Tensor, block: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    """Repeat per-block values over their blocks and crop to ``shape``."""
    out = values
    for k, b in enumerate(block):
        ax = len(shape) - len(block) + k
        out = out.repeat_interleave(b, dim=ax).narrow(ax, 0, shape[ax])
    return out
