"""The compiled amax loops of the operand kernels (numba): per block and per tensor.

Dimension letters: A, B the rows and columns of the operand as it lies in memory.

Every loop reads `xb` (A, B), the uint32 or uint16 bits of float32 or bfloat16 input, and
takes the integer max of the sign-masked bits (`xb & mask`): the bits of max |x|, exact in
any order (a NaN's bits are above every number's, so NaN wins, as in
[normlab.kernels.block_scale_jit.amax_bits][]). Outputs are bits in xb's dtype; the
adapter in `normlab.kernels.operand` reads them as float32.
"""

from __future__ import annotations

from numba import njit, prange

from normlab.kernels._adapt import jit

__all__ = ["amax_cols", "amax_row_blocks", "amax_rows"]


@jit()
def amax_cols(xb, ra, mask, out):
    """out[ba, b] = max over rows a of block ba of (xb[a, b] & mask): column blocks (ra, 1).

    The integer max of sign-masked float bits is the max of |x| (a NaN above every number),
    as [normlab.kernels.block_scale_jit.amax_bits][]; the loop runs along rows, which
    vectorises.
    """
    A, B = xb.shape
    for ba in prange(out.shape[0]):
        for b in range(B):
            out[ba, b] = 0
        for a in range(ba * ra, min(A, (ba + 1) * ra)):
            for b in range(B):
                out[ba, b] = max(out[ba, b], xb[a, b] & mask)


@jit()
def amax_rows(xb, mask, out):
    """out[a] = max over row a of (xb[a, b] & mask): a whole operand's amax in one read-only
    pass, parallel over rows (`out.max()` finishes it; the integer max is exact in any
    order, as in `amax_cols`)."""
    A, B = xb.shape
    for a in prange(A):
        m = out.dtype.type(0)
        for b in range(B):
            m = max(m, xb[a, b] & mask)
        out[a] = m


@njit(inline="always")
def _row_block_amaxes(xb, a, k, full, mask, out):
    """out[a, bb] for the `full` blocks (1, k) of row `a` (k a literal at the call: the
    block's max is one fixed-length reduction)."""
    for bb in range(full):
        m = out.dtype.type(0)
        base = bb * k
        for j in range(k):
            m = max(m, xb[a, base + j] & mask)
        out[a, bb] = m


@jit()
def amax_row_blocks(xb, rb, mask, out):
    """out[a, bb] = max over block bb of row a of (xb[a, b] & mask): blocks (1, rb) along
    rows, as `amax_cols` (a row's full blocks in one loop of fixed-length runs, literal
    lengths for NVFP4's 16, MX's 32 and blockwise FP8's 128; the ragged tail after them)."""
    A, B = xb.shape
    full = B // rb
    for a in prange(A):
        if rb == 16:
            _row_block_amaxes(xb, a, 16, full, mask, out)
        elif rb == 32:
            _row_block_amaxes(xb, a, 32, full, mask, out)
        elif rb == 128:
            _row_block_amaxes(xb, a, 128, full, mask, out)
        else:
            _row_block_amaxes(xb, a, rb, full, mask, out)
        if full * rb < B:
            m = out.dtype.type(0)
            for b in range(full * rb, B):
                m = max(m, xb[a, b] & mask)
            out[a, full] = m
