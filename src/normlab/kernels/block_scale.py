"""Block amax for the block-scaled recipes (NVFP4, blockwise FP8, MX): the adapter.

Dimension letters: A leading blocks of rows, R rows, C columns (x seen as (A, R, C)),
r x c the block shape, nR = ceil(R / r), nC = ceil(C / c).

Contract: the kernel behind [normlab.precision.scaled.tiling.block_amax][] on NumPy arrays, named
`"block_amax"` in `normlab._backend.KERNELS`. It receives the reference's validated
`(x, block)` and returns the same values or `NotImplemented` (only float32 and float64 are
served): max |x| over each
block, NaN if the block holds a NaN, in x's dtype (exact: a max is one of the inputs),
shape `lead + (nR, nC)` or `lead + (nC,)`. One pass over x, parallel over rows of
blocks; the result does not depend on the thread count. (Rescaling the blocks needs no
kernel: NumPy broadcasts one value per block in a single pass.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels import block_scale_jit as jit
from normlab.kernels._adapt import FLOATS, launch

__all__: list[str] = []


def block_amax(x: np.ndarray, block: tuple[int, ...]) -> Any:
    """Kernel of the reference `block_amax` (float32/float64 x)."""
    if x.dtype not in FLOATS or x.size == 0:
        return NotImplemented
    tail = x.shape[x.ndim - len(block):]
    R, C = tail if len(tail) == 2 else (1, tail[0])
    r, c = (block[0], block[1]) if len(block) == 2 else (1, block[0])
    x3 = np.ascontiguousarray(x).reshape(-1, R, C)  # A,R,C
    utype: Any = np.uint32 if x.dtype == np.float32 else np.uint64
    mask = utype(2 ** (8 * x.dtype.itemsize - 1) - 1)  # all bits but the sign
    bits = np.empty((x3.shape[0], -(-R // r), -(-C // c)), utype)
    launch(jit.amax_bits, x.size, x3.view(utype), r, c, mask, bits)
    out = bits.view(x.dtype)
    lead = x.shape[: x.ndim - len(block)]
    return out.reshape(*lead, *out.shape[1:]) if len(block) == 2 else out.reshape(
        *lead, out.shape[2])
