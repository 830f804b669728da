"""encode/decode of every code, ml_dtypes storage, bit_layout, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ML_TYPES
from normlab.precision import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    FLOAT32,
    NAMED_FORMATS,
    Format,
    bit_layout,
    decode,
    encode,
    from_ml_dtypes,
    quantize,
    to_ml_dtypes,
)

STORAGE = ML_TYPES
SMALL = [f for f in NAMED_FORMATS if f.bits <= 16]


def _all_codes(fmt):
    return np.arange(2**fmt.bits, dtype=np.uint8 if fmt.bits <= 8 else np.uint16)


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_decode_every_code_matches_ml_dtypes(fmt):
    codes = _all_codes(fmt)
    got = decode(codes, fmt)
    want = codes.view(STORAGE[fmt.name]).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert got.dtype == np.float32 and same.all()


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_decode_round_trip_of_every_code(fmt, dtype):
    codes = _all_codes(fmt)
    values = decode(codes, fmt).astype(dtype)
    back = encode(values, fmt)
    nan = np.isnan(values)
    assert back.dtype == codes.dtype
    assert np.array_equal(back[~nan], codes[~nan])
    # every NaN code encodes to the canonical one ml_dtypes produces for NaN
    canon = np.array([np.nan], np.float32).astype(STORAGE[fmt.name]).view(codes.dtype)
    assert set(back[nan & ~np.signbit(values)].tolist()) <= set(canon.tolist())


def test_float32_codes_round_trip_on_a_sample():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 2**32, size=2**18, dtype=np.uint64).astype(np.uint32)
    values = decode(codes, FLOAT32)
    assert np.array_equal(values.view(np.uint32)[~np.isnan(values)],
                          codes[~np.isnan(values)])  # decode is the identity on bits
    ok = ~np.isnan(values)
    assert np.array_equal(encode(values[ok], FLOAT32), codes[ok])


def test_hand_codes():
    # 1.0 in E4M3: exponent field 7 (= bias), mantissa 0 -> 0b0_0111_000 = 0x38
    assert encode(np.array([1.0, -2.0, 448.0], np.float32), FLOAT8_E4M3FN).tolist() == [
        0x38, 0xC0, 0x7E,
    ]
    assert encode(np.array([np.inf, -np.inf]), FLOAT8_E5M2).tolist() == [0x7C, 0xFC]
    assert encode(np.array([2.0**-127, 1.0, np.nan]), FLOAT8_E8M0FNU).tolist() == [0, 127, 255]
    assert encode(np.array([-0.0, 6.0]), FLOAT4_E2M1FN).tolist() == [0x8, 0x7]


def test_encode_rejects_what_the_format_cannot_hold():
    with pytest.raises(ValueError, match="round first with quantize"):
        encode(np.array([0.1], np.float32), BFLOAT16)
    with pytest.raises(ValueError, match="cannot represent"):
        encode(np.array([np.inf], np.float32), FLOAT8_E4M3FN)
    with pytest.raises(ValueError, match="cannot represent"):
        encode(np.array([np.nan], np.float32), FLOAT4_E2M1FN)
    with pytest.raises(TypeError, match="float32 or float64"):
        encode(np.array([1], np.int32), BFLOAT16)


def test_decode_rejects_bad_codes():
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        decode(np.array([16]), FLOAT4_E2M1FN)
    with pytest.raises(ValueError, match="must lie in"):
        decode(np.array([-1]), FLOAT8_E4M3FN)
    with pytest.raises(TypeError, match="unsigned integers"):
        decode(np.array([1.0]), FLOAT8_E4M3FN)


@pytest.mark.parametrize("fmt", NAMED_FORMATS, ids=lambda f: f.name)
def test_to_and_from_ml_dtypes(fmt):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(4096) * 4).astype(np.float32)
    if not fmt.signed:
        x = np.abs(x) + np.float32(2.0**-100)
    stored = to_ml_dtypes(x, fmt, saturate=True)
    assert stored.dtype == np.dtype(STORAGE[fmt.name])
    assert stored.itemsize == (fmt.bits + 7) // 8  # fp6 and fp4 take one byte each
    want = quantize(x, fmt, saturate=True)
    assert np.array_equal(stored.astype(np.float32), want)  # ml_dtypes reads our codes
    assert np.array_equal(from_ml_dtypes(stored), want)


def test_ml_dtypes_storage_bad_input():
    with pytest.raises(ValueError, match="no numpy/ml_dtypes storage"):
        to_ml_dtypes(np.ones(2, np.float32), Format("e3m3", 3, 3))
    with pytest.raises(TypeError, match="dtypes"):
        from_ml_dtypes(np.ones(2, np.int16))


def test_bit_layout_by_hand():
    # 0.1 = 1.6 * 2^-4: exponent 123 = 0b01111011, mantissa round(0.6 * 128) = 77 = 0b1001101
    lay = bit_layout(0.1, "bf16")
    assert (lay.code, lay.sign, lay.exponent, lay.mantissa, lay.kind) == (
        0x3DCD, 0, 123, 77, "normal",
    )
    text = str(lay)
    assert "0 01111011 1001101" in text and "2^(123 - 127)" in text and "rounds to" in text
    sub = bit_layout(2.0**-9, "e4m3")  # the smallest subnormal: field 0, mantissa 001
    assert (sub.code, sub.kind) == (0x01, "subnormal") and "2^(1 - 7)" in str(sub)
    assert bit_layout(-0.0, "fp4").code == 0x8 and bit_layout(-0.0, "fp4").kind == "zero"
    assert bit_layout(np.inf, "e5m2").kind == "inf"
    nan = bit_layout(1000.0, "e4m3")  # beyond 464: NaN without saturation
    assert nan.kind == "nan" and nan.code == 0x7F
    e8 = bit_layout(3.0, "e8m0")  # no sign, no mantissa; 3 rounds up to 4 = 2^(129 - 127)
    assert (e8.code, e8.rounded) == (0x81, 4.0) and "sign" not in str(e8)


def test_bit_layout_bad_input():
    with pytest.raises(TypeError, match="one real number"):
        bit_layout(np.ones(2), "bf16")
    with pytest.raises(ValueError, match="cannot represent"):
        bit_layout(float("nan"), "fp4")
