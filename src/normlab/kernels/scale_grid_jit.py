"""The block-scale rules of MX and NVFP4 on a block grid, compiled (numba).

Dimension letters: nA x nB the block grid.

The kernel twins of [normlab.precision.scaled.block_scales][] (the rules, written once, are there):
each loop maps a grid of float32 block amaxes (non-negative, NaN for a block holding a
NaN) to what the operand kernels multiply by, in one pass over the grid instead of a chain
of NumPy temporaries. Every operation is the reference's float32 (or float64, for the OCP
exponent) operation on the same value, so the results are equal bit for bit;
`tests/kernels/test_kernels_scale_grid.py` checks them against the reference on grids of
zeros, float32 subnormals, NaN, inf and values around every power of two. No fastmath.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from normlab.kernels._adapt import jit
from normlab.kernels.quantize_jit import narrow_consts, nearest_narrow

__all__ = ["mx_grid", "nvfp4_grid"]

@njit(inline="always")
def _pow2_f32(k):
    """2^k as float32 for integer k in [-127, 127] (2^-127 is float32's subnormal 2^-1 x
    2^-126)."""
    if k >= -126:
        return np.uint32(np.uint32(k + 127) << np.uint32(23)).view(np.float32)
    return np.uint32(0x00400000).view(np.float32)


@njit(inline="always")
def _ocp_code(a, emax):
    """The OCP rule: floor(log2 a) - emax from a's float64 exponent, clamped below at
    -127; 255 for inf, NaN or an exponent above 127."""
    bits = np.float64(a).view(np.uint64)
    expo = np.int64((bits >> np.uint64(52)) & np.uint64(0x7FF)) - 1023
    e = max(expo - emax, np.int64(-127))
    if a != a or a == np.inf or e > 127:
        return np.int64(255)
    return e + 127


@njit(inline="always")
def _round_up_code(a, inv_max):
    """TE's rule: the E8M0 code of float32(a) * float32(1 / elem max), rounded up."""
    v = np.float32(a * inv_max)
    bits = v.view(np.uint32)
    exponent = np.int64((bits >> np.uint32(23)) & np.uint32(0xFF))
    mantissa = np.int64(bits & np.uint32(0x7FFFFF))
    bump = mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000)
    code = exponent + (1 if bump else 0)
    if v == 0:
        code = np.int64(0)
    if v == np.inf:
        code = np.int64(0xFE)
    if v != v:
        code = np.int64(255)
    return code


@jit()
def mx_grid(amax, emax, round_up, inv_max, mul, d1, codes):
    """Per block: the E8M0 code (`codes`, uint8), the factor `mul` = 2^(127 - code) the
    elements are multiplied by and the decode factor `d1` = 2^(code - 127) (code 255:
    `mul` 1 and `d1` NaN), all (nA, nB). `round_up` picks TE's rule, else OCP's."""
    nA, nB = amax.shape
    nan = np.uint32(0x7FC00000).view(np.float32)
    for i in prange(nA):
        for j in range(nB):
            a = amax[i, j]
            code = _round_up_code(a, inv_max) if round_up else _ocp_code(a, emax)
            codes[i, j] = np.uint8(code)
            if code == 255:
                mul[i, j] = np.float32(1.0)
                d1[i, j] = nan
            else:
                mul[i, j] = _pow2_f32(127 - code)
                d1[i, j] = _pow2_f32(code - 127)


@jit()
def nvfp4_grid(amax, s_mul, s_dec, m, emin, maxbits, ovf, flush_bits, inf_out, nan_keep,
               nan_out, f32max, e_b, s_b):
    """Per block: s_b = e4m3(float32(amax * s_mul)) (nearest even, saturating: the
    rounding parameters of E4M3 from `normlab.kernels.quantize.round_params`) and
    e_b = min(1 / float32(s_b * s_dec), f32max), NaN staying NaN; both (nA, nB)."""
    nA, nB = amax.shape
    sh, low, bias, mn, c = narrow_consts(m, emin)
    u = np.uint32
    for i in prange(nA):
        for j in range(nB):
            bits = np.float32(amax[i, j] * s_mul).view(np.uint32)
            s = u(bits & u(0x80000000))
            r = nearest_narrow(u(bits ^ s), s, maxbits, ovf, flush_bits, inf_out, nan_keep,
                               nan_out, sh, low, bias, mn, c)
            b = np.uint32(r).view(np.float32)
            s_b[i, j] = b
            p = np.float32(b * s_dec)
            v = np.float32(np.inf) if p == 0 else np.float32(np.float32(1.0) / p)
            e_b[i, j] = f32max if v > f32max else v
