"""Independent oracles for the recipe differential suite: each rule written out again.

These restate the published rules one scalar (or one block) at a time, in plain Python and
NumPy float32 scalars, without calling normlab's recipe arithmetic: Transformer Engine's
``compute_scale_from_amax`` (``recipe_common.cuh``) with normlab's documented 2^-127 floor,
TE's fused delayed update as its CUDA kernel loop (``delayed_scaling.cu``) and its unfused
torch path (``fp8.py``), the OCP MX floor rule and TE's MXFP8 round-up rule, TE's NVFP4
two-level scales and DeepSeek/TE blockwise scales. Element rounding uses normlab's NumPy
rounding engine (``normlab.precision.quantize``), which the rounding suites verify against
ml_dtypes on every code and midpoint; it is not recipe arithmetic.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from normlab.precision import quantize
from normlab.precision.formats.format import FLOAT4_E2M1FN, FLOAT8_E4M3FN, Format

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def f32(v) -> np.float32:
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return F32(v)


def bits(v: np.float32) -> int:
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def from_bits(b: int) -> np.float32:
    return F32(struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0])


def te_scale(amax, fp8_max, *, margin=0, eps=0.0, pow2=False, previous=1.0, update="fused",
             value_for_inf=FLT_MAX) -> np.float32:
    """TE compute_scale_from_amax (fused) or the unfused torch formula, one amax."""
    a = f32(amax)
    if a < f32(eps):  # NaN < eps is False
        a = f32(eps)
    if not (math.isfinite(float(a)) and a > 0):
        return f32(previous)
    with np.errstate(over="ignore", under="ignore"):
        if update == "fused":  # scaled_max = fp8_max * 2^-margin, then one float32 division
            scaled_max = f32(float(f32(fp8_max)) * math.ldexp(1.0, max(-400, min(400, -margin))))
            s = f32(scaled_max / a)
        else:  # torch: fp8_max / amax is reciprocal(amax) * fp8_max; then / 2^margin
            q = f32(f32(fp8_max) * f32(F32(1.0) / a))
            s = f32(float(q) * math.ldexp(1.0, max(-400, min(400, -margin))))
    if math.isinf(float(s)):
        s = f32(value_for_inf)
    s = max(s, F32(2.0**-127))  # normlab's floor (the one documented deviation from TE)
    if pow2:
        s = from_bits(bits(s) & 0xFF800000)
    return s


def _fmaxf(a, b):
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def te_delayed_update(h, previous, fp8_max, margin, algo, update):
    """One delayed update: TE's fused kernel loop or its unfused torch path."""
    h = [f32(v) for v in h]
    n, last = len(h), h[0]
    if update == "fused":
        amax, new = F32(0.0), list(h)
        if last != 0:  # NaN != 0
            for i in range(n):
                a = h[i + 1] if i < n - 1 else last
                amax = f32(_fmaxf(amax, a))
                new[i] = a if i > 0 else F32(0.0)
        if algo == "most_recent":
            amax = last
    else:
        amax = f32(np.max(np.array(h, np.float32))) if algo == "max" else last  # NaN wins
        new = [F32(0.0), *h[2:], last] if n > 1 else [F32(0.0)]
    s = te_scale(amax, fp8_max, margin=margin, previous=previous, update=update)
    return np.array(new, np.float32), s


def record(h0, amax):
    """Slot 0 as a running max of the step's amaxes; a NaN sticks."""
    a = f32(amax)
    return F32(np.nan) if (math.isnan(h0) or math.isnan(a)) else max(F32(h0), a)


def per_tensor_parts(x: np.ndarray, fmt: Format, scale) -> tuple[np.ndarray, np.ndarray]:
    """(sat_round(x * scale), that times float32(1 / scale)), x float32."""
    s = f32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        data = quantize((x * s).astype(np.float32), fmt, saturate=True)
        return data, (data * f32(F32(1.0) / s)).astype(np.float32)


def per_tensor(x: np.ndarray, fmt: Format, scale) -> np.ndarray:
    """sat_round(x * scale) * float32(1 / scale), x float32."""
    return per_tensor_parts(x, fmt, scale)[1]


def amax_of(a: np.ndarray) -> float:
    """max |a| with NaN winning (0 for an empty block)."""
    if a.size == 0:
        return 0.0
    return float("nan") if np.isnan(a).any() else float(np.abs(a.astype(np.float64)).max())


def current(x: np.ndarray, fmt: Format, *, margin=0, eps=0.0, pow2=False):
    """(dequantised, data) of current scaling."""
    s = te_scale(amax_of(x), fmt.max, margin=margin, eps=eps, pow2=pow2)
    data, deq = per_tensor_parts(x, fmt, s)
    return deq, data


def _blocks_1d(x: np.ndarray, axis: int, k: int):
    """(row view index, slice) of every 1-D block of k along axis (2-D x)."""
    n = x.shape[axis]
    for r in range(x.shape[1 - axis]):
        for c0 in range(0, n, k):
            yield (slice(r, r + 1), slice(c0, c0 + k)) if axis == 1 else (
                slice(c0, c0 + k), slice(r, r + 1))


def _blocks_2d(x: np.ndarray, k: int):
    for r0 in range(0, x.shape[0], k):
        for c0 in range(0, x.shape[1], k):
            yield slice(r0, r0 + k), slice(c0, c0 + k)


def mx_code(amax: float, fmt: Format, rule: str) -> int:
    """The E8M0 code of a block by the OCP floor rule or TE's round-up rule."""
    if rule == "ocp":
        if math.isnan(amax) or math.isinf(amax):
            return 255
        if amax == 0:
            return 0
        _, ex = math.frexp(amax)  # amax = m 2^ex, m in [0.5, 1)
        e = max(ex - 1 - fmt.emax, -127)
        return 255 if e > 127 else e + 127
    if math.isnan(amax):
        return 255
    v = f32(f32(amax) * f32(1.0 / fmt.max))
    if math.isinf(float(v)):
        return 254
    if v == 0:
        return 0
    b = bits(v)
    exponent, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
    up = mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000)
    return exponent + int(up)


def mx(x: np.ndarray, fmt: Format, axis: int, k: int, rule: str):
    """(dequantised, elements) of MX, blocks of k along axis (the last one may be short)."""
    out, elements = np.empty_like(x), np.empty_like(x)
    for idx in _blocks_1d(x, axis, k):
        blk = x[idx].astype(np.float64)
        code = mx_code(amax_of(blk), fmt, rule)
        if code == 255:
            out[idx] = elements[idx] = np.nan
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            elems = quantize(blk / 2.0 ** (code - 127), fmt, saturate=True)
            elements[idx] = elems
            out[idx] = (elems * 2.0 ** (code - 127)).astype(np.float32)
    return out, elements


def nvfp4(x: np.ndarray, *, axis: int, two_d: bool, seed: int | None) -> np.ndarray:
    """(dequantised, elements) of NVFP4 (TE's float32 order), 1 x 16 along axis or 16 x 16
    tiles."""
    amax_t = f32(amax_of(x))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ok = math.isfinite(float(amax_t)) and amax_t > 0
        s_enc = min(f32(F32(2688.0) / amax_t), FLT_MAX) if ok else F32(1.0)
        s_dec = f32(F32(1.0) / s_enc)
        sixth = f32(1.0 / 6.0)
        scaled = np.empty_like(x)
        s_b = np.empty_like(x)
        nan_block = np.zeros(x.shape, bool)
        blocks = _blocks_2d(x, 16) if two_d else _blocks_1d(x, axis, 16)
        for idx in blocks:
            a = f32(amax_of(x[idx]))
            sb = quantize(np.array([f32(a * f32(s_enc * sixth))], np.float32), FLOAT8_E4M3FN,
                          saturate=True)[0]
            e_b = min(f32(F32(1.0) / f32(sb * s_dec)), FLT_MAX)
            scaled[idx] = (x[idx] * e_b).astype(np.float32)
            s_b[idx] = sb
            nan_block[idx] = math.isnan(float(a))
        mode = "nearest" if seed is None else "stochastic"
        q = quantize(scaled, FLOAT4_E2M1FN, saturate=True, rounding=mode, seed=seed)
        out = ((q * s_b).astype(np.float32) * s_dec).astype(np.float32)
    out[nan_block] = q[nan_block] = np.nan
    return out, q


def blockwise(x: np.ndarray, fmt: Format, block: tuple[int, int], axis: int, *, pow2=False,
              eps=0.0, value_for_inf=FLT_MAX) -> np.ndarray:
    """(dequantised, data) of blockwise FP8: 1 x K tiles along axis, or K x K tiles."""
    out, data = np.empty(x.shape, np.float32), np.empty(x.shape, np.float32)
    k = block[1]
    blocks = _blocks_2d(x, k) if block[0] > 1 else _blocks_1d(x, axis, k)
    for idx in blocks:
        s = te_scale(amax_of(x[idx]), fmt.max, eps=eps, pow2=pow2, value_for_inf=value_for_inf)
        data[idx], out[idx] = per_tensor_parts(x[idx].astype(np.float32), fmt, s)
    return out, data


def torchao_scale(amax: float, fp8_max: float) -> np.float32:
    """torchao's rowwise scale, restated: float32(fp8_max / max(amax, 1e-12)) formed in
    float64, then the largest power of two not above it (an exact floor; torchao's float32
    log2 can round up a few ulps below a power of two, see test_rowwise_torchao); NaN for
    an inf or NaN amax (torchao's 0 or NaN scale: the slice dequantises to NaN)."""
    if math.isnan(amax) or math.isinf(amax):
        return F32(math.nan)
    s = F32(fp8_max / max(amax, 1e-12))
    return F32(2.0 ** math.floor(math.log2(float(s)))) if s != s * 2 else s


def rowwise(x: np.ndarray, fmt: Format, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(dequantised, data) of torchao's axis-wise cast: one scale per slice along `axis`
    (2-D x), or one for the tensor (`axis` None)."""
    slices = ([(slice(None), slice(None))] if axis is None else
              [(slice(r, r + 1), slice(None)) if axis == 1 else (slice(None), slice(r, r + 1))
               for r in range(x.shape[1 - axis])])
    out, data = np.empty(x.shape, np.float32), np.empty(x.shape, np.float32)
    for idx in slices:
        s = torchao_scale(amax_of(x[idx]), fmt.max)
        if s != s:  # a non-finite slice: all NaN (normlab writes the positive quiet NaN)
            data[idx] = out[idx] = np.float32(np.nan)
            continue
        data[idx], out[idx] = per_tensor_parts(x[idx].astype(np.float32), fmt, s)
    return out, data
