"""Bit-exact agreement of quantize(..., "nearest") with ml_dtypes' float32 casts.

Dimension letters: N test inputs.

Every comparison is exact (bit patterns, NaN compared as NaN): rounding is specified to the
last bit. fp6/fp4 are compared with ``saturate=True`` because ml_dtypes always saturates
them; NaN inputs are left out for them (ml_dtypes turns NaN into a zero there, normlab
keeps NaN: tested separately below).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import ML_DTYPES_E8M0_SUBNORMAL_UP, ML_PAIRS
from normlab.precision import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT16,
    quantize,
)

PAIRS = ML_PAIRS
SMALL = [(f, t) for f, t in PAIRS if f.bits <= 8]


def _values_of(ml_type, bits):
    """Every value of a <= 8-bit ml_dtypes type, from its own codes (not from normlab)."""
    codes = np.arange(2**bits, dtype=np.uint8)
    return codes.view(ml_type).astype(np.float32)


def _ties_and_neighbours(values):
    """Midpoints between neighbouring finite values (exact in float32), and 1 ulp either side."""
    v = np.unique(values[np.isfinite(values)].astype(np.float64))  # sorted
    top = v[-1]
    mids = (v[:-1] + v[1:]) / 2  # exact: at most 9 significant bits
    mids = np.append(mids, top + (top - v[-2]) / 2)  # the overflow boundary above max
    mids = mids.astype(np.float32)
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(-np.inf))
    return np.concatenate([mids, up, down, -mids, -up, -down])


def _inputs():
    rng = np.random.default_rng(20261129)
    parts = [
        np.arange(2**16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32),
        np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32),
        rng.integers(0, 2**32, size=2**20, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ]
    for fmt, ml_type in SMALL:
        values = _values_of(ml_type, fmt.bits)
        parts += [values, _ties_and_neighbours(values)]
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32))
    return np.concatenate(parts)  # (N,)


X = _inputs()


def _same(a, b):
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize(("fmt", "ml_type"), PAIRS, ids=lambda p: getattr(p, "name", ""))
def test_nearest_matches_ml_dtypes_bit_for_bit(fmt, ml_type):
    x = X if fmt.has_nan else X[~np.isnan(X)]
    if fmt.name == "float8_e8m0fnu" and ML_DTYPES_E8M0_SUBNORMAL_UP:
        # float32 subnormals below the tie 1.5 * 2^-127: ml_dtypes < 0.7 sends them up to
        # 2^-126, normlab rounds the value (test_quantize_golden covers both)
        x = x[~((np.abs(x) > 2.0**-127) & (np.abs(x) < 1.5 * 2.0**-127))]
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(ml_type).astype(np.float32)
    got = quantize(x, fmt, saturate=not fmt.has_nan)
    bad = ~_same(got, expected)
    assert got.dtype == np.float32
    assert not bad.any(), (fmt.name, x[bad][:5], got[bad][:5], expected[bad][:5])


def test_input_set_covers_ties_and_the_whole_range():
    # The sample must contain exact ties of E4M3 (e.g. 464 = (448 + 480) / 2) and subnormals.
    assert 464.0 in X and np.float32(2.0**-10) in X
    assert (np.abs(X[np.isfinite(X)]) > 1e30).any() and ((X != 0) & (np.abs(X) < 1e-40)).any()
    assert X.size >= 2**20


def test_e4m3fn_overflow_boundary_464_as_ml_dtypes():
    x = np.array([448, 464, np.nextafter(np.float32(464), np.float32(1e9)), 1e9], np.float32)
    got = quantize(x, FLOAT8_E4M3FN)
    # 464 is the tie between 448 (mantissa 110, even) and 480 (not a value): stays 448
    assert got[:2].tolist() == [448.0, 448.0]
    assert np.isnan(got[2:]).all()
    assert quantize(x, FLOAT8_E4M3FN, saturate=True).tolist() == [448.0] * 4


@pytest.mark.parametrize(
    ("fmt", "ml_type"),
    [(FLOAT4_E2M1FN, ml_dtypes.float4_e2m1fn), (FLOAT6_E2M3FN, ml_dtypes.float6_e2m3fn),
     (FLOAT6_E3M2FN, ml_dtypes.float6_e3m2fn)],
)
def test_nan_stays_nan_where_ml_dtypes_makes_zero(fmt, ml_type):
    # Chosen knowingly: ml_dtypes maps NaN to a signed zero in these NaN-less types; normlab
    # keeps NaN in the float32 result (a NaN must not vanish), and encode() refuses it.
    x = np.array([np.nan, -np.nan], np.float32)
    assert (x.astype(ml_type).astype(np.float32) == 0).all()  # what ml_dtypes does
    assert np.isnan(quantize(x, fmt)).all()
    assert np.isnan(quantize(x, fmt, saturate=True)).all()


PEER_TYPES = {
    BFLOAT16.name: ml_dtypes.bfloat16,
    FLOAT8_E4M3FN.name: ml_dtypes.float8_e4m3fn,
    FLOAT16.name: np.float16,  # numpy's own cast: float64 -> float16 rounds once
    FLOAT8_E5M2.name: ml_dtypes.float8_e5m2,
}


def test_float64_rounds_once_where_float32_would_double_round():
    # x = midpoint between two neighbours plus a tiny excess that float32 cannot hold: the
    # correct answer is the upper neighbour; through float32 it becomes an exact tie and
    # ties-to-even picks the lower one where it is even (every case but E5M2's subnormal).
    cases = []
    for fmt, lo, ulp in ((BFLOAT16, 1.0, 2.0**-7), (FLOAT8_E4M3FN, 1.0, 2.0**-3),
                         (FLOAT16, 1.0, 2.0**-10), (FLOAT8_E5M2, 2.0**-16, 2.0**-16)):
        x = lo + ulp / 2 + ulp * 2.0**-30  # excess < float32's ulp
        assert np.float64(np.float32(x)) == lo + ulp / 2  # float32 rounding makes a tie
        cases.append((fmt, x, lo, lo + ulp))
    for fmt, x, _, expected in cases:
        got = quantize(np.array([x, -x]), fmt)
        assert got.dtype == np.float64
        assert got.tolist() == [expected, -expected], fmt.name
    # ml_dtypes < 0.7 casts float64 through float32 and so rounds the ties to the even
    # neighbour; 0.7 rounds float64 once. Detect which one is installed: where the
    # peer rounds once it must agree with normlab, where it double-rounds it must give
    # exactly the through-float32 answer (and normlab does not copy it).
    for fmt, x, lo, expected in cases:
        ml = PEER_TYPES[fmt.name]
        peer = float(np.array([x]).astype(ml).astype(np.float64)[0])
        through_f32 = float(np.array([x], np.float32).astype(ml).astype(np.float64)[0])
        # the float32 tie goes to the even neighbour: lo (mantissa 0), except for E5M2's
        # subnormal lo = 2^-16 (mantissa 1, odd), whose even neighbour is the upper one
        assert through_f32 == (expected if fmt is FLOAT8_E5M2 else lo), fmt.name
        assert peer in (expected, through_f32), fmt.name


def test_float64_to_float32_and_float16_match_numpy_direct_casts():
    # numpy converts float64 to float32 and to float16 directly (one rounding, ties to even),
    # an independent oracle for the float64 path over the whole double range.
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**63, size=2**18, dtype=np.int64).astype(np.uint64)
    bits[::2] |= np.uint64(1 << 63)
    x = bits.view(np.float64)
    near = rng.standard_normal(2**16) * np.exp2(rng.uniform(-160, 140, 2**16))
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are among the inputs
        x = np.concatenate([x, near, near.astype(np.float32).astype(np.float64)])
        x16 = x[~(np.abs(x) >= 1e6)]  # NaN kept
        want32 = x.astype(np.float32).astype(np.float64)
        want16 = x16.astype(np.float16).astype(np.float64)
    for got, want in ((quantize(x, "fp32"), want32), (quantize(x16, "fp16"), want16)):
        ok = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want))
        assert ok.all(), (got[~ok][:3], want[~ok][:3])
