"""The compiled loops of the operand kernels (numba): scale, round, encode, decode by blocks.

Dimension letters: A, B the rows and columns of the operand as it lies in memory (the
logical operand or its transpose), ra x rb one block there, nA = ceil(A / ra),
nB = ceil(B / rb) the block grid.

Arguments every loop shares:
  xb (A, B) uint32 or uint16: the bits of float32 or bfloat16 input (bfloat16 widens
      exactly: its bits are the high half of the float32's).
  mul (nA, nB) float32: the factor each block is multiplied by before rounding.
  d1 (nA, nB) float32, d2 float32: the dequantised value is `(e * d1) * d2` for the
      rounded element e (d2 = 1 except for NVFP4: a product by 1 changes no bits); a NaN
      d1 marks a NaN block, whose values are the quiet NaN 0x7FC00000 and whose codes
      are `nanc`.
  rounding: the integer parameters of `normlab.kernels.quantize.round_params` (float32,
      saturating or not, as the recipe says) and, for stochastic rounding, `seed` and the
      word strides (wa, wb): element (a, b) takes the word splitmix64(seed + a wa + b wb),
      its index in the logical operand's flattened C order.
  encoding (see `_encode`): `ebias` = 127 - the format's bias, `m`, `minnorm` (bits of its
      smallest normal), `sub_shift` = emin - m + 150, `nanc` / `infc` the codes of +NaN /
      +inf, `sbit` the sign's position.
Outputs: values `vo` or codes `co`, in xb's orientation (A, B) or transposed (B, A)
(`flip`), codes two per byte along the output's last axis when `packed`. No fastmath:
every product is the IEEE float32 product, as in the NumPy reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import jit
from normlab.kernels.quantize_jit import (
    join_magnitude,
    narrow_consts,
    nearest_narrow,
    split_magnitude,
    splitmix64,
)

__all__ = ["decode_blocks", "encode_blocks", "encode_values", "fake_blocks", "fake_encode_flat"]

_INF = np.uint32(0x7F800000)
_SIGN = np.uint32(0x80000000)
_GROUP = 32  # rows per parallel task: an even number (packed codes pair rows when flipped)


@njit(inline="always")
def _wide(xb, a, b):
    """float32 bits of element (a, b): uint32 as it is, bfloat16's uint16 shifted up."""
    if xb.itemsize == 2:
        return np.uint32(np.uint32(xb[a, b]) << np.uint32(16))
    return np.uint32(xb[a, b])


@njit(inline="always")
def _stochastic(mag, s, m, emin, qbits, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out,
                word):
    """`mag` rounded up iff the remainder's 0.64 fraction plus `word` reaches 2^64 (the
    rule of `quantize_jit.round_stochastic`), the sign `s` put back."""
    u = np.uint32
    d, dc, _n, rem, _half = split_magnitude(mag, u, 23, 127, m, emin)
    r = np.uint64(rem)
    left = r << np.uint64(min(max(64 - d, 0), 63))
    right = r >> np.uint64(min(max(d - 64, 0), 63))
    r64 = left if d <= 64 else right
    return join_magnitude(mag, s, u, r64 > ~word, d, dc, 23, _INF, qbits, maxbits, ovf,
                          flush_bits, inf_out, nan_keep, nan_out)


@njit(inline="always")
def _encode(rb, ebias, m, minnorm, sub_shift, nanc, infc, sbit):
    """The code of the rounded float32 bits `rb` (a value the format holds, or NaN/inf).

    Normal values: the exponent rebiased and the top `m` mantissa bits. Below the format's
    smallest normal the value is n 2^(emin - m) with n < 2^m: the float32 significand
    (implicit bit included) shifted right by `sub_shift - max(E, 1)`, E the float32
    exponent field. Every intermediate is cast back to uint32: numba widens 32-bit
    integer arithmetic.
    """
    u = np.uint32
    s = u(rb >> u(31))
    a = u(rb & u(0x7FFFFFFF))
    e = u(a >> u(23))
    mmask = u(u(u(1) << u(m)) - u(1))
    normal = u(u(u(e - u(ebias)) << u(m)) | u(u(a >> u(23 - m)) & mmask))
    sig = u(u(a & u(0x7FFFFF)) | (u(0x800000) if e > u(0) else u(0)))
    shift = np.int64(sub_shift) - np.int64(e if e > u(1) else u(1))
    shift = shift if shift > 0 else np.int64(0)
    sub = u(sig >> u(shift if shift < 31 else np.int64(31)))
    code = normal if a >= minnorm else sub
    code = u(infc) if a == _INF else code
    code = u(nanc) if a > _INF else code
    return u(code | u(s << u(sbit)))


@njit(inline="always")
def _factors(mul, d1, ba, rb, srow, frow):
    """The per-column scale and dequantisation factor of block row `ba` (its grid values
    spread over their blocks); `mul` may be a (1, 1) grid."""
    B = srow.shape[0]
    one = mul.shape[0] == 1 and mul.shape[1] == 1
    if rb < B and rb & (rb - 1) == 0:  # power-of-two blocks: one indexed pass
        sh = 0
        while (1 << sh) < rb:
            sh += 1
        drow = d1[ba]
        if one:
            s0 = mul[0, 0]
            for b in range(B):
                srow[b] = s0
                frow[b] = drow[b >> sh]
        else:
            mrow = mul[ba]
            for b in range(B):
                srow[b] = mrow[b >> sh]
                frow[b] = drow[b >> sh]
        return
    for bb in range(d1.shape[1]):
        s = mul[0, 0] if one else mul[ba, bb]
        f = d1[ba, bb]
        for b in range(bb * rb, min(B, (bb + 1) * rb)):
            srow[b] = s
            frow[b] = f


@njit(inline="always")
def _fake_nearest(x, sv, fv, d2, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out, sh,
                  low, bias, mn, c):
    """The dequantised value of float32 `x` scaled by `sv`, rounded to nearest, times `fv`
    then `d2` (the quiet NaN where `fv` is NaN)."""
    u = np.uint32
    bits = np.float32(x * sv).view(np.uint32)
    s = u(bits & _SIGN)
    r = nearest_narrow(u(bits ^ s), s, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out,
                       sh, low, bias, mn, c)
    v = np.float32(np.float32(np.uint32(r).view(np.float32) * fv) * d2)
    return u(0x7FC00000).view(np.float32) if fv != fv else v


@njit(inline="always")
def _fake_stochastic(x, sv, fv, d2, m, emin, qbits, maxbits, ovf, flush_bits, inf_out,
                     nan_keep, nan_out, word):
    """`_fake_nearest` with stochastic rounding by the random `word`."""
    u = np.uint32
    bits = np.float32(x * sv).view(np.uint32)
    s = u(bits & _SIGN)
    r = _stochastic(u(bits ^ s), s, m, emin, qbits, maxbits, ovf, flush_bits, inf_out,
                    nan_keep, nan_out, word)
    v = np.float32(np.float32(np.uint32(r).view(np.float32) * fv) * d2)
    return u(0x7FC00000).view(np.float32) if fv != fv else v


@njit(cache=True)
def _fake_row_nearest(xb, a, k, mul, d1, ba, d2, m, emin, maxbits, ovf, flush_bits,
                      inf_out, nan_keep, nan_out, vrow):
    """Row `a` of blocks (1, k) rounded to nearest (k a literal at the call: the inner
    loop has a fixed trip count and vectorises without the per-element factor rows),
    block row `ba` of the grids; the ragged tail after the full blocks takes its block's
    factors."""
    B = xb.shape[1]
    sh, low, bias, mn, c = narrow_consts(m, emin)
    one = mul.shape[0] == 1 and mul.shape[1] == 1
    for bb in range(-(-B // k)):
        sv = mul[0, 0] if one else mul[ba, bb]
        fv = d1[ba, bb]
        b0 = bb * k
        if b0 + k <= B:
            for j in range(k):
                x = np.uint32(_wide(xb, a, b0 + j)).view(np.float32)
                vrow[b0 + j] = _fake_nearest(x, sv, fv, d2, maxbits, ovf, flush_bits,
                                             inf_out, nan_keep, nan_out, sh, low, bias, mn, c)
        else:
            for b in range(b0, B):
                x = np.uint32(_wide(xb, a, b)).view(np.float32)
                vrow[b] = _fake_nearest(x, sv, fv, d2, maxbits, ovf, flush_bits, inf_out,
                                        nan_keep, nan_out, sh, low, bias, mn, c)


@njit(cache=True)
def _fake_row_stochastic(xb, a, k, mul, d1, ba, d2, m, emin, qbits, maxbits, ovf,
                         flush_bits, inf_out, nan_keep, nan_out, seed, wa, wb, vrow):
    """`_fake_row_nearest` with stochastic rounding: element (a, b) takes the word
    splitmix64(seed + a wa + b wb), block by block (a per-element block index cost 7x)."""
    B = xb.shape[1]
    one = mul.shape[0] == 1 and mul.shape[1] == 1
    w_row = np.uint64(seed) + np.uint64(a * wa)  # the words wrap mod 2^64 either way
    for bb in range(-(-B // k)):  # block by block: the factors once per block, no division
        sv, fv = (mul[0, 0] if one else mul[ba, bb]), d1[ba, bb]
        for b in range(bb * k, min(B, bb * k + k)):
            x = np.uint32(_wide(xb, a, b)).view(np.float32)
            vrow[b] = _fake_stochastic(x, sv, fv, d2, m, emin, qbits, maxbits, ovf, flush_bits,
                                       inf_out, nan_keep, nan_out,
                                       splitmix64(w_row + np.uint64(b * wb)))


def _fake_blocks_source(K: int, STOCHASTIC: bool) -> Any:
    """The body of `fake_blocks` with the row run `K` (16, 32, 128; 0 for any other
    block) and the rounding (`STOCHASTIC`) fixed: closure constants, so numba prunes the
    branches the operand never takes and compiles only the one it uses."""

    def fake_blocks(xb, ra, rb, mul, d1, d2, m, emin, qbits, maxbits, ovf, flush_bits,
                    inf_out, nan_keep, nan_out, stochastic, seed, wa, wb, flip, vo):
        A, B = xb.shape
        sh, low, bias, mn, c = narrow_consts(m, emin)
        for g in prange(-(-A // _GROUP)):
            srow = np.empty(0 if K else B, np.float32)
            frow = np.empty(0 if K else B, np.float32)
            tile = np.empty((_GROUP if flip else 0, B), np.float32)
            current = -1
            a0, a1 = g * _GROUP, min(A, (g + 1) * _GROUP)
            for a in range(a0, a1):
                vrow = tile[a - a0] if flip else vo[a]  # unflipped rows are written in place
                if K and STOCHASTIC:
                    _fake_row_stochastic(xb, a, K, mul, d1, a // ra, d2, m, emin, qbits,
                                         maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out,
                                         seed, wa, wb, vrow)
                    continue
                if K:
                    _fake_row_nearest(xb, a, K, mul, d1, a // ra, d2, m, emin, maxbits, ovf,
                                      flush_bits, inf_out, nan_keep, nan_out, vrow)
                    continue
                if a // ra != current:  # a new row of blocks
                    current = a // ra
                    _factors(mul, d1, current, rb, srow, frow)
                w0 = np.uint64(seed) + np.uint64(a * wa)
                if STOCHASTIC and wb == 1:  # words of consecutive indices: no product
                    for b in range(B):
                        x = np.uint32(_wide(xb, a, b)).view(np.float32)
                        vrow[b] = _fake_stochastic(x, srow[b], frow[b], d2, m, emin, qbits,
                                                   maxbits, ovf, flush_bits, inf_out,
                                                   nan_keep, nan_out,
                                                   splitmix64(w0 + np.uint64(b)))
                elif STOCHASTIC:
                    for b in range(B):
                        x = np.uint32(_wide(xb, a, b)).view(np.float32)
                        vrow[b] = _fake_stochastic(x, srow[b], frow[b], d2, m, emin, qbits,
                                                   maxbits, ovf, flush_bits, inf_out,
                                                   nan_keep, nan_out,
                                                   splitmix64(w0 + np.uint64(b * wb)))
                else:
                    for b in range(B):
                        x = np.uint32(_wide(xb, a, b)).view(np.float32)
                        vrow[b] = _fake_nearest(x, srow[b], frow[b], d2, maxbits, ovf,
                                                flush_bits, inf_out, nan_keep, nan_out, sh,
                                                low, bias, mn, c)
            if flip:  # the group's rows go out as runs of the output's rows
                for b in range(B):
                    for a in range(a0, a1):
                        vo[b, a] = tile[a - a0, b]

    return fake_blocks


_FAKE_BLOCKS: dict[tuple[int, bool], Any] = {}  # (K, stochastic) -> its DualKernel


def fake_blocks(rb: int, B: int, nb: int, stochastic: bool) -> Any:
    """The `DualKernel` that scales, rounds and dequantises every element into `vo`.

    Pick it by the block's columns `rb`, the operand's `B`, the grid's `nb` columns and
    the rounding; call it with `(xb, ra, rb, mul, d1, d2, <rounding>, stochastic, seed,
    wa, wb, flip, vo)`, writing `vo` ((A, B), or (B, A) if `flip`); arguments in the
    module header. Per row: blocks of 16, 32 or 128 along the row (NVFP4's, MX's,
    blockwise FP8's) run block by block with fixed-length loops (`_fake_row_nearest`,
    `_fake_row_stochastic`);
    other blocks spread their factors over the row first, then one branch-free loop over
    the row (vectorised) writes the output row. One parallel task per `_GROUP` rows.
    Flipped, the group's rows are kept and written out together, column by column (runs
    of `_GROUP` contiguous values instead of one value per output row).
    """
    runs = rb < B and rb in (16, 32, 128) and nb == -(-B // rb)
    return _fake_blocks_kernel(rb if runs else 0, bool(stochastic))


def _fake_blocks_kernel(K: int, stochastic: bool) -> Any:
    """`fake_blocks` for run `K` (0: any block) and the rounding: its own kernel, compiled
    on its first call (a recipe compiles the one path its operands take, not all eight)."""
    if (K, stochastic) not in _FAKE_BLOCKS:
        _FAKE_BLOCKS[K, stochastic] = jit()(_fake_blocks_source(K, stochastic))
        _FAKE_BLOCKS[K, stochastic].locate_as(__name__, "_fake_blocks_kernel", (K, stochastic))
    return _FAKE_BLOCKS[K, stochastic]


@jit()
def encode_blocks(xb, ra, rb, mul, d1, m, emin, maxbits, ovf, flush_bits, inf_out,
                  nan_keep, nan_out, ebias, minnorm, sub_shift, nanc, infc, sbit, flip,
                  packed, co):
    """Scale, round to nearest and encode every element into `co` ((A, B), or (B, A) if
    `flip`; two codes per byte along the last axis if `packed`); a NaN block's codes are
    `nanc`. Per row as `fake_blocks`; one parallel task per `_GROUP` rows (an even
    number: packed pairs across rows are written by one task, the even row first)."""
    A, B = xb.shape
    sh, low, bias, mn, c = narrow_consts(m, emin)
    u = np.uint32
    for g in prange(-(-A // _GROUP)):
        srow = np.empty(B, np.float32)
        frow = np.empty(B, np.float32)
        tile = np.zeros((_GROUP if flip else 1, B + 1), np.uint32)
        current = -1
        a0, a1 = g * _GROUP, min(A, (g + 1) * _GROUP)
        for a in range(a0, a1):
            crow = tile[a - a0] if flip else tile[0]
            if a // ra != current:  # a new row of blocks
                current = a // ra
                _factors(mul, d1, current, rb, srow, frow)
            for b in range(B):
                vb = np.float32(np.uint32(_wide(xb, a, b)).view(np.float32) * srow[b])
                bits = vb.view(np.uint32)
                s = u(bits & _SIGN)
                r = nearest_narrow(u(bits ^ s), s, maxbits, ovf, flush_bits, inf_out,
                                   nan_keep, nan_out, sh, low, bias, mn, c)
                code = _encode(r, ebias, m, minnorm, sub_shift, nanc, infc, sbit)
                crow[b] = u(nanc) if frow[b] != frow[b] else code
            if flip:
                continue  # written out with the group's other rows below
            if not packed:
                for b in range(B):
                    co[a, b] = crow[b]
            else:
                for j in range(-(-B // 2)):
                    co[a, j] = u(crow[2 * j] | u(crow[2 * j + 1] << u(4)))
        if flip and not packed:  # runs of the output's rows, as in `fake_blocks`
            for b in range(B):
                for a in range(a0, a1):
                    co[b, a] = tile[a - a0, b]
        elif flip:  # rows a0, a0 + 1 share a byte (a0 even): the even one in the low half
            for b in range(B):
                for a in range(a0, a1, 2):
                    hi = tile[a + 1 - a0, b] if a + 1 < a1 else u(0)
                    co[b, a >> 1] = u(tile[a - a0, b] | u(hi << u(4)))


@jit()
def decode_blocks(co, ra, rb, lut, d1, d2, packed, vo):
    """`vo[a, b] = (lut[code] * d1) * d2` over the stored codes `co` (the quiet NaN in a
    NaN block); codes, blocks and `vo` all in the stored orientation (A, B)."""
    A, B = vo.shape
    mask = len(lut) - 1
    qnan = np.uint32(0x7FC00000).view(np.float32)
    ones = np.ones((1, 1), np.float32)
    for g in prange(-(-A // _GROUP)):
        srow = np.empty(B, np.float32)
        frow = np.empty(B, np.float32)
        current = -1
        for a in range(g * _GROUP, min(A, (g + 1) * _GROUP)):
            if a // ra != current:
                current = a // ra
                _factors(ones, d1, current, rb, srow, frow)
            if packed:  # two codes a byte, the even element in the low half
                for j in range(B >> 1):
                    byte = np.int64(co[a, j])
                    lo = np.float32(np.float32(lut[byte & 15] * frow[2 * j]) * d2)
                    hi = np.float32(np.float32(lut[(byte >> 4) & 15] * frow[2 * j + 1]) * d2)
                    vo[a, 2 * j] = qnan if frow[2 * j] != frow[2 * j] else lo
                    vo[a, 2 * j + 1] = qnan if frow[2 * j + 1] != frow[2 * j + 1] else hi
                if B & 1:
                    code = np.int64(co[a, B >> 1]) & 15
                    last = np.float32(np.float32(lut[code] * frow[B - 1]) * d2)
                    vo[a, B - 1] = qnan if frow[B - 1] != frow[B - 1] else last
            else:
                for b in range(B):
                    code = np.int64(co[a, b]) & mask
                    value = np.float32(np.float32(lut[code] * frow[b]) * d2)
                    vo[a, b] = qnan if frow[b] != frow[b] else value


@jit()
def encode_values(vb, ebias, m, minnorm, sub_shift, nanc, infc, sbit, co):
    """co[i] = the code of the float32 bits vb[i], a value the format holds (or NaN/inf):
    `_encode` alone, no rounding (NVFP4's E4M3 block scales, exact by construction)."""
    for i in prange(vb.shape[0]):
        co[i] = _encode(np.uint32(vb[i]), ebias, m, minnorm, sub_shift, nanc, infc, sbit)


@jit()
def fake_encode_flat(xb, mul, d1, m, emin, maxbits, ovf, flush_bits, inf_out, nan_keep,
                     nan_out, ebias, minnorm, sub_shift, nanc, infc, sbit, vo, co):
    """`fake_blocks` and `encode_blocks` in one pass for one scale over the whole operand
    (`mul`, `d1` float32 scalars; no blocks, no flip, no packing): each element is scaled
    and rounded once, then written as its value `r * d1` into `vo` and as its code into
    `co` (A, B). A NaN `d1` gives quiet NaN values and NaN codes, as there."""
    A, B = xb.shape
    sh, low, bias, mn, c = narrow_consts(m, emin)
    u = np.uint32
    qnan = u(0x7FC00000).view(np.float32)
    bad = d1 != d1
    for a in prange(A):
        for b in range(B):
            vb = np.float32(np.uint32(_wide(xb, a, b)).view(np.float32) * mul)
            bits = vb.view(np.uint32)
            s = u(bits & _SIGN)
            r = nearest_narrow(u(bits ^ s), s, maxbits, ovf, flush_bits, inf_out, nan_keep,
                               nan_out, sh, low, bias, mn, c)
            v = np.float32(np.uint32(r).view(np.float32) * d1)
            code = _encode(r, ebias, m, minnorm, sub_shift, nanc, infc, sbit)
            vo[a, b] = qnan if bad else v
            co[a, b] = u(nanc) if bad else code
