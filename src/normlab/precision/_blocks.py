"""Block tiling shared by the block-scaled recipes (NVFP4, blockwise FP8).

Dimension letters: A the leading axes of x flattened, R and C the blocked axes' lengths
(C only for 1-D blocks), r and c a block's shape, nR = ceil(R / r), nC = ceil(C / c).

A block shape covers the trailing axes of x: ``(c,)`` blocks the last axis in runs of c,
``(r, c)`` the last two in r-by-c tiles. A length that is not a multiple of the block is
padded with zeros for the block statistics only (a zero changes no amax); the results
are cropped back to x's shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab import _backend
from normlab._validate import check_int

__all__ = ["block_amax", "check_block_shape", "expand", "multiply_blocks", "work_dtype"]


def work_dtype(arr: np.ndarray) -> np.dtype:
    """float64 for float64 input of any byte order ('>f8' too), else float32."""
    wide = arr.dtype.kind == "f" and arr.dtype.itemsize >= 8
    return np.dtype(np.float64 if wide else np.float32)


def check_block_shape(block_shape: Any, ndim: int, name: str = "block_shape") -> tuple[int, ...]:
    """A tuple of 1 or 2 positive ints, no longer than x's number of axes."""
    if not isinstance(block_shape, (tuple, list)) or len(block_shape) not in (1, 2):
        raise ValueError(f"{name} must be a tuple of one or two positive ints; got "
                         f"{block_shape!r}")
    shape = tuple(check_int(b, name, minimum=1) for b in block_shape)
    if len(shape) > ndim:
        raise ValueError(f"{name} {shape} blocks {len(shape)} axes but x has only {ndim}")
    return shape


def _tiles(x: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """x padded and reshaped to (A, nR, r, nC, c) (1-D blocks: r = nR = 1)."""
    full = block if len(block) == 2 else (1, block[0])
    lead = x.shape[: x.ndim - len(block)]
    tail = x.shape[x.ndim - len(block):]
    R, C = (tail if len(tail) == 2 else (1, tail[0]))
    r, c = full
    nR, nC = -(-R // r), -(-C // c)
    a = x.reshape(int(np.prod(lead, dtype=np.int64)), R, C)  # A,R,C
    if nR * r != R or nC * c != C:
        a = np.pad(a, ((0, 0), (0, nR * r - R), (0, nC * c - C)))
    return a.reshape(a.shape[0], nR, r, nC, c)  # A,nR,r,nC,c


def block_amax(x: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """max |x| over each block (NaN if the block holds one), exact (one of |x|'s values).

    Returns shape ``lead + (nR, nC)`` for 2-D blocks, ``lead + (nC,)`` for 1-D; float64
    (x's dtype when the kernel serves it: the same values).
    """
    out: np.ndarray = _backend.dispatch("block_amax", _block_amax_reference, x, block)
    return out


def _block_amax_reference(x: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    t = np.abs(_tiles(x.astype(np.float64), block))  # A,nR,r,nC,c
    m = t.max(axis=(2, 4))  # A,nR,nC
    lead = x.shape[: x.ndim - len(block)]
    return m.reshape(*lead, *m.shape[1:]) if len(block) == 2 else m.reshape(*lead, m.shape[2])


def multiply_blocks(x: np.ndarray, values: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """``x * values`` with each block's value repeated over its block (x's dtype).

    ``values`` (the block grid, see :func:`block_amax`) must already have x's dtype, so
    every product is one IEEE multiplication in that dtype.
    """
    full = block if len(block) == 2 else (1, block[0])
    tail = x.shape[x.ndim - len(block):]
    R, C = tail if len(tail) == 2 else (1, tail[0])
    if R % full[0] or C % full[1]:
        return x * expand(values, block, x.shape)
    v = values.reshape(-1, R // full[0], 1, C // full[1], 1)  # A,nR,1,nC,1
    return (x.reshape(v.shape[0], v.shape[1], full[0], v.shape[3], full[1]) * v).reshape(
        x.shape)


def expand(values: np.ndarray, block: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Repeat per-block values over their blocks and crop to ``shape`` (x's shape)."""
    out = values
    for k, b in enumerate(block):
        ax = len(shape) - len(block) + k
        out = np.repeat(out, b, axis=ax)
        out = out[(slice(None),) * ax + (slice(0, shape[ax]),)]
    return out
