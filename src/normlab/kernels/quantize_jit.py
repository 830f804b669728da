"""Elementwise rounding of float32/float64 bit patterns to a small binary float (numba).

Dimension letters: N elements (the flattened C-order input).

Contract: `round_into(xbits, out, ...)` reads the unsigned bits of each input element
(uint32 for float32, uint64 for float64) and writes the bits of the rounded value, in the
input's own format, to `out`. The target is described by integers only (no Format object
crosses into numba): m mantissa bits, emin/emax the unbiased exponents of the smallest and
largest normal binade, `maxmant` the largest significand (with the implicit bit) in the
top binade, and the bit patterns to write on overflow, for NaN and for infinities.

Algorithm (integer only, one rounding, no detour through another float type): write
|x| = sig * 2^(E - M) with sig the significand including the implicit bit. The target's
quantum at that magnitude is 2^(max(E, emin) - m), so d = M - m + max(E, emin) - E low bits
of sig are discarded: n = sig >> d, rem = sig mod 2^d, and the mode decides whether n goes
up by one. The result is rebuilt on the input's own bits: when d <= M the discarded bits
are the low d bits of the stored mantissa, so ((|x| >> d) + up) << d is exact (a carry moves
into the exponent field, which is the next binade); when d > M the magnitude is below one target
quantum q = 2^(emin - m) and the result is 0 or q. Every branch is a select, so LLVM
vectorises the loop.

Same exponent range (`round_nearest_same_range`): when the target has the input's exponent
field (float32 -> bf16, or any E8My with bias 127, IEEE inf/NaN and subnormals), every
quantum is 2^(M - m) units of the input's bits, binades and subnormals included, so
round-to-nearest-even is the classic bit trick: add 2^(d-1) - 1 plus the lowest kept bit,
clear the low d = M - m bits (a carry moves into the exponent field; above max it lands
exactly on the infinity bits). No exponent decode, so the loop runs at copy speed.

Stochastic rounding: element i uses the 64-bit word w_i (SplitMix64 of seed + i, or given);
it rounds up iff rem + (w_i >> (64 - d)) >= 2^d, so P(up) = rem / 2^d exactly.
No `fastmath` anywhere in this module: rounding must be exact.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import jit

__all__ = [
    "bit_consts",
    "fix_unsigned_or_zeroless",
    "join_magnitude",
    "narrow_consts",
    "narrow_nearest",
    "nearest_narrow",
    "round_away",
    "round_nearest",
    "round_nearest_narrow",
    "round_nearest_same_range",
    "round_stochastic",
    "round_zero",
    "special_rules",
    "split_magnitude",
    "splitmix64",
]


# One kernel per mode: a runtime mode switch inside the loop stops LLVM from vectorising it.
# Shared arguments of every kernel (all unsigned integers of the input's bit width u):
#   xbits, out (N,) u: input bits and output bits (float32 -> uint32, float64 -> uint64)
#   m, emin: target mantissa bits and smallest normal exponent
#   qbits: bits of the target's smallest quantum 2^(emin - m) in the input format
#   maxbits: bits of the target's largest finite value; a rounded magnitude above it
#       overflows and becomes `ovf` (inf, NaN or max, chosen by the caller)
#   flush_bits: rounded magnitudes below it become 0 (targets without subnormals; else 0)
#   inf_out: written for an infinite input; nan_keep: 1 keeps an input NaN, 0 writes nan_out
# The sign is put back last, so -0.0 and negative values keep it.


@njit(inline="always")
def split_magnitude(a, u, M, B, m, emin):
    """(d, dc, n, rem, half) of the magnitude bits `a`: d discarded bits, dc = min(d, M+2).

    `u` is the unsigned type of the bits. Every intermediate is cast back to `u` (or
    int32): numba widens 32-bit integer arithmetic to 64 bits, which halves the SIMD lanes
    of the float32 loop, and would turn mixed signed/unsigned arithmetic into float64.
    """
    one = u(1)
    implicit = u(one << u(M))
    eb = np.int32(u(a >> u(M)))
    sig = u(u(a & u(implicit - one)) | (implicit if eb != 0 else u(0)))
    # emin - e with e = max(eb, 1) - B, the unbiased exponent (subnormals count as 1 - B)
    below = np.int32(np.int32(emin + B) - max(eb, np.int32(1)))
    d = np.int32(np.int32(M - m) + max(below, np.int32(0)))
    dc = u(min(d, np.int32(M + 2)))  # beyond M + 2 every significand is below half a quantum
    n = u(sig >> dc)
    rem = u(sig & u(u(one << dc) - one))
    half = u(u(one << dc) >> one)
    return d, dc, n, rem, half


@njit(inline="always")
def join_magnitude(a, s, u, up, d, dc, M, infb, qbits, maxbits, ovf, flush_bits,
          inf_out, nan_keep, nan_out):
    """Rebuild the rounded bits, then apply overflow, flush, inf and NaN rules; adds the sign."""
    r = u(u(u(a >> dc) + (u(1) if up else u(0))) << dc)
    r = r if d <= np.int32(M) else (qbits if up else u(0))
    r = ovf if r > maxbits else r
    r = u(0) if r < flush_bits else r
    r = inf_out if a == infb else r
    r = (a if nan_keep else nan_out) if a > infb else r
    return u(r | s)


@njit(inline="always")
def bit_consts(xbits):
    """(u, M, B, sign bit, infinity bits) of the input format of the bits array `xbits`.

    Derived from the item size, a compile-time constant, so LLVM folds the shifts.
    """
    u = xbits.dtype.type
    width = xbits.itemsize * 8
    M = 23 if width == 32 else 52
    B = 127 if width == 32 else 1023
    signbit = u(1) << u(width - 1)
    infb = (signbit - u(1)) & ~((u(1) << u(M)) - u(1))
    return u, M, B, signbit, infb


decide: Any  # declared only: each kernel's copy of _split_loop has its own (_split_kernel)


def _split_loop(xbits, out, m, emin, qbits, maxbits, ovf, flush_bits, inf_out, nan_keep,
                nan_out):
    # the loop of round_nearest, round_away and round_zero; `decide` is a global of each
    # kernel's own copy (see _split_kernel)
    u, M, B, signbit, infb = bit_consts(xbits)
    for i in prange(xbits.shape[0]):
        s = u(xbits[i] & signbit)
        a = u(xbits[i] ^ s)
        d, dc, n, rem, half = split_magnitude(a, u, M, B, m, emin)
        up = decide(u, n, rem, half)  # noqa: F821  (bound in each kernel's globals)
        out[i] = join_magnitude(a, s, u, up, d, dc, M, infb, qbits, maxbits, ovf,
                                flush_bits, inf_out, nan_keep, nan_out)


def _split_kernel(name: str, decide: Any, doc: str) -> Any:
    """`_split_loop` rounding up where `decide(u, n, rem, half)`, compiled as kernel `name`.

    `decide` (an inline jitted function) is a global of this kernel's copy of the loop, so
    each kernel is specialised on its rule (no mode switch inside the loop) and cached on
    disk under its own name. A closure would not do: numba keys the cache of a closure on
    the pickled cell, which differs in every process, so it would compile on every start.
    """
    loop = types.FunctionType(_split_loop.__code__, {**globals(), "decide": decide}, name)
    loop.__qualname__ = name
    loop.__doc__ = doc
    return jit()(loop)


@njit(inline="always")
def _ties_to_even(u, n, rem, half):
    # on a tie, up only when the kept significand n is odd (so it ends even)
    return (rem > half) | ((rem == half) & (half != u(0)) & (u(n & u(1)) == u(1)))


@njit(inline="always")
def _ties_away(u, n, rem, half):
    return (rem >= half) & (half != u(0))


@njit(inline="always")
def _toward_zero(u, n, rem, half):
    return False


round_nearest = _split_kernel(
    "round_nearest", _ties_to_even,
    "Round to nearest, ties to even (the kept significand n stays even on a tie).",
)
"""The kernel of `RoundingMode.NEAREST` (its `__doc__` states the rule)."""
round_away = _split_kernel("round_away", _ties_away, "Round to nearest, ties away from zero.")
"""The kernel of `RoundingMode.NEAREST_AWAY` (its `__doc__` states the rule)."""
round_zero = _split_kernel(
    "round_zero", _toward_zero,
    "Round toward zero (truncate the discarded bits; overflow gives `ovf`, usually max).",
)
"""The kernel of `RoundingMode.TOWARD_ZERO` (its `__doc__` states the rule)."""


@jit()
def round_nearest_same_range(xbits, out, d, cap):
    """Round to nearest even for a target with the input's exponent range (module header).

    `d` (1 <= d <= M - 1) low bits are discarded; `cap` bounds the rounded magnitude:
    the infinity bits (overflow and inf stay inf) or the target's max bits (saturate).
    A NaN input becomes the quiet NaN with its sign, payload dropped, as in the reference.
    """
    u, M, _B, signbit, infb = bit_consts(xbits)
    one = u(1)
    sh = u(d)
    low = u(u(one << sh) - one)  # the discarded bits
    bias = u(low >> one)  # 2^(d-1) - 1: below half; the kept lsb makes a tie go to even
    qnan = u(infb | u(one << u(M - 1)))
    for i in prange(xbits.shape[0]):
        s = u(xbits[i] & signbit)
        a = u(xbits[i] ^ s)
        r = u(u(u(a + bias) + u(u(a >> sh) & one)) & u(~low))
        r = r if r < cap else cap
        r = qnan if a > infb else r
        out[i] = u(r | s)


@njit(inline="always")
def narrow_consts(m, emin):
    """(sh, low, bias, minnorm, c) of `narrow_nearest` (float32 input)."""
    u, M, B = np.uint32, 23, 127
    one = u(1)
    sh = u(M - m)
    low = u(u(one << sh) - one)
    bias = u(low >> one)
    minnorm = u(u(emin + B) << u(M))  # bits of 2^emin
    c = np.uint32(u(emin - m + M + B) << u(M)).view(np.float32)  # C = 2^(emin - m + 23)
    return sh, low, bias, minnorm, c


@njit(inline="always")
def narrow_nearest(a, u, sh, low, bias, minnorm, c):
    """The magnitude bits `a` (float32) rounded to nearest even, before the special rules
    (see `round_nearest_narrow`)."""
    one = u(1)
    r_norm = u(u(u(a + bias) + u(u(a >> sh) & one)) & u(~low))
    v = np.uint32(a).view(np.float32)
    r_sub = np.float32(np.float32(v + c) - c).view(np.uint32)
    return r_norm if a >= minnorm else u(r_sub)


@njit(inline="always")
def special_rules(a, r, u, infb, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out):
    """Overflow, flush, infinity and NaN rules on the rounded magnitude `r` of `a`."""
    r = ovf if r > maxbits else r
    r = u(0) if r < flush_bits else r
    r = inf_out if a == infb else r
    return (a if nan_keep else nan_out) if a > infb else r


@njit(inline="always")
def nearest_narrow(a, s, maxbits, ovf, flush_bits, inf_out, nan_keep, nan_out, sh, low,
                   bias, minnorm, c):
    """The float32 magnitude bits `a` rounded to nearest even (`narrow_nearest`), the
    special rules applied, the sign bit `s` put back: one element of
    `round_nearest_narrow`."""
    u = np.uint32
    r = narrow_nearest(a, u, sh, low, bias, minnorm, c)
    return u(special_rules(a, r, u, u(0x7F800000), maxbits, ovf, flush_bits, inf_out,
                           nan_keep, nan_out) | s)


@jit()
def round_nearest_narrow(xbits, out, m, emin, qbits, maxbits, ovf, flush_bits,
                         inf_out, nan_keep, nan_out):
    """Round float32 to nearest even for a target with fewer exponent bits (fp8/fp6/fp4).

    Same arguments and results as [round_nearest][normlab.kernels.quantize_jit.round_nearest]
    (float32 bits, 1 <= m <= 22, emin >= -126), without its per-element exponent decode. Where
    |x| >= 2^emin the target's quantum is 2^(E - m), d = 23 - m low bits of the float32 pattern
    go: the bit trick of
    [round_nearest_same_range][normlab.kernels.quantize_jit.round_nearest_same_range] (the kept
    lsb is the target's mantissa lsb, so a tie goes to even). Below 2^emin the quantum is q =
    2^(emin - m) for every input, and one float32 addition rounds to it: with C = 2^(emin - m +
    23), C + |x| lies in [C, 2C), whose spacing is q, so the hardware's round-to-nearest-even
    gives C + n q with n even on a tie, and (C + |x|) - C = n q exactly. No fastmath: the
    addition and subtraction are kept as written. Overflow, flush, inf and NaN rules as in
    [join_magnitude][normlab.kernels.quantize_jit.join_magnitude].
    """
    u, _M, _B, signbit, _infb = bit_consts(xbits)
    sh, low, bias, minnorm, c = narrow_consts(m, emin)
    for i in prange(xbits.shape[0]):
        s = u(xbits[i] & signbit)
        out[i] = nearest_narrow(u(xbits[i] ^ s), s, maxbits, ovf, flush_bits, inf_out,
                                nan_keep, nan_out, sh, low, bias, minnorm, c)


@njit(inline="always")
def splitmix64(z):
    """SplitMix64 output for the 64-bit counter z (golden-gamma increment included)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@jit()
def round_stochastic(xbits, out, m, emin, qbits, maxbits, ovf,
                     flush_bits, inf_out, nan_keep, nan_out, words, seed, use_seed):
    """Stochastic rounding: up iff r64 + w >= 2^64 with r64 = rem / 2^d as a 0.64 fraction.

    For d <= 64 this is rem + (w >> (64 - d)) >= 2^d, so P(up) = rem / 2^d exactly; beyond
    64 discarded bits the fraction is truncated to 64 bits (as in the reference).

    w is words[i] (explicit uint64 bits) or splitmix64(seed + i) when `use_seed`; the
    counter is the flat C-order index, so the result does not depend on the thread count.
    """
    u, M, B, signbit, infb = bit_consts(xbits)
    for i in prange(xbits.shape[0]):
        s = xbits[i] & signbit
        a = xbits[i] ^ s
        d, dc, _n, rem, _half = split_magnitude(a, u, M, B, m, emin)
        w = splitmix64(np.uint64(seed) + np.uint64(i)) if use_seed else words[i]
        r = np.uint64(rem)
        left = r << np.uint64(min(max(64 - d, 0), 63))  # rem / 2^d as a 0.64 fraction
        right = r >> np.uint64(min(max(d - 64, 0), 63))  # d > 64: truncated fraction
        r64 = left if d <= 64 else right
        up = r64 > ~w  # r64 + w >= 2^64
        out[i] = join_magnitude(a, s, u, up, d, dc, M, infb, qbits, maxbits, ovf, flush_bits,
                       inf_out, nan_keep, nan_out)


@jit()
def fix_unsigned_or_zeroless(xbits, out, minnorm, qnan, no_zero, unsigned):
    """Second pass for formats without a zero or without a sign (E8M0), on `out` in place.

    After the rounding pass: finite nonzero magnitudes below the min normal become the min
    normal and a zero result becomes NaN (`no_zero`); a negative nonzero input becomes
    NaN, even when it would round to zero, and only NaN keeps a sign (`unsigned`).
    """
    u, _M, _B, signbit, infb = bit_consts(xbits)
    for i in prange(xbits.shape[0]):
        s = xbits[i] & signbit
        a = xbits[i] ^ s
        r = out[i] & ~signbit
        finite = a < infb
        if no_zero and finite and a != u(0) and a < minnorm:
            r = minnorm
        if no_zero and finite and r == u(0):
            r = qnan
        if unsigned and s != u(0) and a != u(0):
            r = qnan
        keep_sign = (r > infb) or not unsigned
        out[i] = r | (s if keep_sign else u(0))
