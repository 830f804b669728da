"""Format definitions: named constants derived by hand, ml_dtypes.finfo, aliases, bad formats."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from conftest import ML_TYPES
from normlab.precision import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3B11FNUZ,
    FLOAT8_E4M3FN,
    FLOAT8_E4M3FNUZ,
    FLOAT8_E5M2,
    FLOAT8_E5M2FNUZ,
    FLOAT8_E8M0FNU,
    FLOAT16,
    FLOAT32,
    NAMED_FORMATS,
    Format,
    NanConvention,
    formats_table,
    get_format,
)

# Hand-derived from the definitions (max = largest significand * 2^(emax - m)):
# (format, bits, max, min_normal, min_subnormal, eps)
HAND = [
    (FLOAT32, 32, (2 - 2**-23) * 2.0**127, 2.0**-126, 2.0**-149, 2.0**-23),
    (BFLOAT16, 16, (2 - 2**-7) * 2.0**127, 2.0**-126, 2.0**-133, 2.0**-7),
    (FLOAT16, 16, 65504.0, 2.0**-14, 2.0**-24, 2.0**-10),
    # E4M3FN: top binade 2^8 keeps mantissas 000..110 (111 is NaN): 1.75 * 256
    (FLOAT8_E4M3FN, 8, 448.0, 2.0**-6, 2.0**-9, 2.0**-3),
    (FLOAT8_E5M2, 8, 57344.0, 2.0**-14, 2.0**-16, 2.0**-2),
    # fp6/fp4 have no specials: the top field is an ordinary binade
    (FLOAT6_E3M2FN, 6, 28.0, 0.25, 0.0625, 0.25),
    (FLOAT6_E2M3FN, 6, 7.5, 1.0, 0.125, 0.125),
    (FLOAT4_E2M1FN, 4, 6.0, 1.0, 0.5, 0.5),
    # E8M0: codes 0..254 are 2^(c - 127); 255 is NaN; no zero
    (FLOAT8_E8M0FNU, 8, 2.0**127, 2.0**-127, 2.0**-127, 1.0),
    # fnuz: every exponent field is finite (NaN is 0x80): top field 15 - bias 8 = 7,
    # max 1.875 * 2^7; field 1 is 2^(1 - 8); subnormals 2^(1 - 8 - 3)
    (FLOAT8_E4M3FNUZ, 8, 240.0, 2.0**-7, 2.0**-10, 2.0**-3),
    (FLOAT8_E5M2FNUZ, 8, 1.75 * 2.0**15, 2.0**-15, 2.0**-17, 2.0**-2),  # bias 16
    (FLOAT8_E4M3B11FNUZ, 8, 1.875 * 2.0**4, 2.0**-10, 2.0**-13, 2.0**-3),  # bias 11
]

ML = ML_TYPES


@pytest.mark.parametrize(("fmt", "bits", "fmax", "tiny", "sub", "eps"), HAND)
def test_named_constants_by_hand(fmt, bits, fmax, tiny, sub, eps):
    # Exact equality: every constant is a power of two or a short dyadic number.
    assert (fmt.bits, fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.eps) == (
        bits, fmax, tiny, sub, eps,
    )


@pytest.mark.parametrize("fmt", NAMED_FORMATS, ids=lambda f: f.name)
def test_named_constants_match_ml_dtypes_finfo(fmt):
    fi = ml_dtypes.finfo(ML[fmt.name])
    # Exact: finfo stores the same dyadic constants in the type itself.
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.tiny)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.bits == fi.bits


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bf16", BFLOAT16), ("BFloat16", BFLOAT16), ("fp16", FLOAT16), ("half", FLOAT16),
        ("f16", FLOAT16), ("fp32", FLOAT32), ("e4m3", FLOAT8_E4M3FN),
        ("fp8_e4m3", FLOAT8_E4M3FN), ("float8_e4m3fn", FLOAT8_E4M3FN), ("e5m2", FLOAT8_E5M2),
        ("fp8-e5m2", FLOAT8_E5M2), ("fp6_e3m2", FLOAT6_E3M2FN), ("fp6_e2m3", FLOAT6_E2M3FN),
        ("fp4", FLOAT4_E2M1FN), ("e2m1", FLOAT4_E2M1FN), ("e8m0", FLOAT8_E8M0FNU),
        ("float8_e8m0fnu", FLOAT8_E8M0FNU), (FLOAT16, FLOAT16),
        ("e4m3fnuz", FLOAT8_E4M3FNUZ), ("float8_e5m2fnuz", FLOAT8_E5M2FNUZ),
        ("e4m3b11fnuz", FLOAT8_E4M3B11FNUZ), (ml_dtypes.float8_e4m3fnuz, FLOAT8_E4M3FNUZ),
        (np.dtype(ml_dtypes.bfloat16), BFLOAT16), (ml_dtypes.float8_e5m2, FLOAT8_E5M2),
        (np.float16, FLOAT16),
    ],
)
def test_aliases(name, expected):
    assert get_format(name) is expected


def test_exmy_names_build_ieee_like_formats_matching_ml_dtypes():
    # ml_dtypes' float8_e3m4 and float8_e4m3 are IEEE-like (inf and NaN in the top field).
    for name, ml in (("e3m4", ml_dtypes.float8_e3m4), ("float8_e4m3", ml_dtypes.float8_e4m3)):
        fmt = get_format(name)
        fi = ml_dtypes.finfo(ml)
        assert fmt.has_infinity and fmt.nan is NanConvention.IEEE
        assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (
            float(fi.max), float(fi.tiny), float(fi.smallest_subnormal),
        )


def test_user_format_by_hand():
    # E3M3, bias 3, IEEE: field 7 reserved, emax = 6 - 3 = 3, max = (2 - 1/8) * 8 = 15
    fmt = Format("e3m3", 3, 3)
    assert (fmt.bias, fmt.emax, fmt.emin, fmt.max) == (3, 3, -2, 15.0)
    assert fmt.min_subnormal == 2.0**-5
    fn = Format("e3m3fn", 3, 3, nan="fn")
    assert fn.nan is NanConvention.FN
    assert fn.max == (2 - 2 / 8) * 2.0**4  # field 7 is a binade minus its NaN mantissa


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match=r"known names:.*bf16") as info:
        get_format("fp7")
    assert "e4m3" in str(info.value)
    with pytest.raises(TypeError, match="fmt must be a Format"):
        get_format(3.5)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"exponent_bits": 0, "mantissa_bits": 3}, ValueError, "at least one exponent bit"),
        ({"exponent_bits": 8, "mantissa_bits": 24}, ValueError, "at most 32"),
        ({"exponent_bits": 9, "mantissa_bits": 2}, ValueError, "float32's range"),
        # emax = 254 - 100 = 154 > 127; smallest subnormal 2^(1 - 150 - 3) < 2^-149
        ({"exponent_bits": 8, "mantissa_bits": 3, "bias": 100}, ValueError, "float32's range"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "bias": 150}, ValueError, "float32's range"),
        ({"exponent_bits": 4, "mantissa_bits": -1}, ValueError, "mantissa_bits"),
        ({"exponent_bits": 4, "mantissa_bits": 0}, ValueError, "IEEE specials"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "nan": "fnuz", "signed": False},
         ValueError, "fnuz"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "nan": "weird"}, ValueError, "nan must"),
        (
            {"exponent_bits": 4, "mantissa_bits": 3, "nan": "none", "signed": False},
            ValueError, "unsigned",
        ),
        ({"exponent_bits": 4, "mantissa_bits": 3, "has_zero": False}, ValueError, "has_zero"),
        ({"exponent_bits": 4.0, "mantissa_bits": 3}, TypeError, "exponent_bits"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "bias": True}, TypeError, "bias"),
    ],
)
def test_impossible_formats_rejected(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Format("bad", **kwargs)


def test_bad_exmy_names():
    with pytest.raises(ValueError, match="float32's range"):
        get_format("e9m3")
    with pytest.raises(ValueError, match="bits do not hold"):
        get_format("float8_e5m3")


def test_format_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BFLOAT16.mantissa_bits = 8  # type: ignore[misc]
    assert {BFLOAT16: 1}[Format("bfloat16", 8, 7)] == 1


def test_formats_table_lists_every_named_format():
    table = formats_table()
    for fmt in NAMED_FORMATS:
        assert fmt.name in table
    assert "448" in table and "57344" in table and "65504" in table


def test_has_infinity_is_derived_from_the_nan_convention():
    # one fact, one place: only the IEEE convention keeps the top field for +-inf
    for nan, expected in (("ieee", True), ("fn", False), ("fnuz", False), ("none", False)):
        assert Format("x", 4, 3, nan=nan).has_infinity is expected
    assert "has_infinity" not in {f.name for f in dataclasses.fields(Format)}


def test_has_infinity_keyword_is_deprecated_but_still_checked():
    with pytest.warns(DeprecationWarning, match="derived from nan"):
        fmt = Format("float8_e4m3fn", 4, 3, has_infinity=False, nan="fn")
    assert fmt == FLOAT8_E4M3FN
    with (pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="has_infinity")):
        Format("bad", 4, 3, has_infinity=True, nan="fn")
    with (pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="has_infinity")):
        Format("bad", 4, 3, has_infinity=False)  # nan defaults to "ieee"


def test_format_survives_pickle_and_replace():
    import pickle

    assert pickle.loads(pickle.dumps(FLOAT8_E4M3FNUZ)) == FLOAT8_E4M3FNUZ
    renamed = dataclasses.replace(FLOAT8_E4M3FNUZ, name="float8_e4m3b11fnuz", bias=11)
    assert renamed == FLOAT8_E4M3B11FNUZ
