"""The exact scalar reference (Fractions) and the vectorised integer path agree everywhere.

Dimension letters: N test inputs. Comparisons are bit-exact (NaN as NaN), in every mode,
with and without saturation, for float32 and float64 inputs, named and user formats.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FNUZ_FORMATS
from normlab.precision import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    FLOAT16,
    FLOAT32,
    Format,
    RoundingMode,
    decode,
    quantize,
    stochastic_words,
)
from normlab.precision.formats._round_scalar import round_scalar

FORMATS = [
    FLOAT32, BFLOAT16, FLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT6_E3M2FN, FLOAT6_E2M3FN,
    FLOAT4_E2M1FN, FLOAT8_E8M0FNU,
    Format("e5m2ftz", 5, 2, has_subnormals=False),
    Format("e3m4", 3, 4),
    Format("e4m3fnu", 4, 3, nan="fn", signed=False),
    Format("e6m5_b40", 6, 5, bias=40),
    *FNUZ_FORMATS,
]


def _inputs(fmt, dtype, rng):
    """Grid points of fmt, their midpoints and neighbours, and random values: (N,)."""
    if fmt.bits <= 8:
        v = decode(np.arange(2**fmt.bits), fmt).astype(np.float64)
    else:
        v = rng.standard_normal(100) * np.exp2(rng.integers(-20, 20, 100))
    v = np.unique(v[np.isfinite(v)])
    mids = (v[:-1] + v[1:]) / 2
    extra = [0.0, -0.0, np.inf, -np.inf, np.nan, fmt.max * 1.0625, fmt.min_subnormal / 3,
             -fmt.min_subnormal / 3, -fmt.max * 1.0625, 1.25 * 2.0**-127, 1.5 * 2.0**-127]
    rand = rng.standard_normal(150) * np.exp2(rng.uniform(-12, 12, 150)) * fmt.max**0.5
    with np.errstate(over="ignore"):
        x = np.concatenate([v, mids, -mids, extra, rand]).astype(dtype)
        wiggle = np.nextafter(x, np.array(np.inf, dtype))
    return np.concatenate([x, wiggle])


def _same(a, b):
    u = np.uint32 if a.dtype == np.float32 else np.uint64
    return (a.view(u) == b.view(u)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_scalar_reference_agrees_with_vectorised(fmt, dtype):
    rng = np.random.default_rng(11)
    x = _inputs(fmt, dtype, rng)
    words = stochastic_words(99, x.shape)
    for mode in RoundingMode:
        for saturate in (False, True):
            with np.errstate(over="ignore", invalid="ignore"):
                got = quantize(x, fmt, rounding=mode, saturate=saturate, random_bits=words
                               if mode is RoundingMode.STOCHASTIC else None)
            ref = np.array(
                [round_scalar(float(v), fmt, mode, saturate, int(w))
                 for v, w in zip(x, words, strict=True)],
                dtype,
            )
            bad = ~_same(got, ref)
            assert not bad.any(), (mode, saturate, x[bad][:4], got[bad][:4], ref[bad][:4])


def test_scalar_reference_needs_a_word_for_stochastic():
    with pytest.raises(ValueError, match="random word"):
        round_scalar(1.3, BFLOAT16, "stochastic")
