"""The fnuz fp8 formats (NaN = 0x80, no infinity, no -0) against ml_dtypes and by hand.

The bit-exact sweep over every code, midpoint and neighbour runs in
test_quantize_mldtypes.py (the fnuz formats are in conftest's ML_PAIRS); here: the
conventions that make fnuz differ, the codes, and kernel/reference agreement.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import FNUZ_FORMATS, ML_TYPES
from normlab import _backend
from normlab.precision import decode, encode, from_ml_dtypes, quantize, to_ml_dtypes


@pytest.mark.parametrize("fmt", FNUZ_FORMATS, ids=lambda f: f.name)
def test_conventions_by_hand(fmt):
    x = np.array([-0.0, -1e-30, np.inf, -np.inf, np.nan, 2 * fmt.max], np.float32)
    with np.errstate(over="ignore"):
        got = quantize(x, fmt)
    assert got[:2].tolist() == [0.0, 0.0] and not np.signbit(got[:2]).any()  # no -0
    assert np.isnan(got[2:]).all()  # no infinity: inf and overflow are NaN
    assert quantize(x[2:4], fmt, saturate=True).tolist() == [fmt.max, -fmt.max]
    # codes: NaN is the sign bit alone, +0 is 0, -0.0 is stored as +0
    assert encode(np.array([np.nan, 0.0, -0.0, -fmt.max], np.float32), fmt).tolist() == [
        0x80, 0x00, 0x00, 0xFF,
    ]
    assert np.isnan(decode(np.array([0x80]), fmt)[0])
    assert decode(np.array([0x7F, 0xFF]), fmt).tolist() == [fmt.max, -fmt.max]


@pytest.mark.parametrize("fmt", FNUZ_FORMATS, ids=lambda f: f.name)
def test_every_code_decodes_as_ml_dtypes_and_round_trips(fmt):
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ML_TYPES[fmt.name]).astype(np.float32)
    got = decode(codes, fmt)
    assert ((got.view(np.uint32) == want.view(np.uint32)) | np.isnan(got) & np.isnan(want)).all()
    ok = ~np.isnan(got)
    assert np.array_equal(encode(got[ok], fmt), codes[ok])
    stored = to_ml_dtypes(got[ok], fmt)
    assert stored.dtype == np.dtype(ML_TYPES[fmt.name])
    assert np.array_equal(from_ml_dtypes(stored), got[ok])


@pytest.mark.parametrize("fmt", FNUZ_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "nearest_away", "stochastic"])
def test_kernel_and_reference_agree_bit_for_bit(fmt, mode, rng):
    bits = rng.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), decode(np.arange(256), fmt),
                        -decode(np.arange(256), fmt)])
    out = []
    for backend in ("numba", "numpy"):
        with _backend.use_backend(backend), np.errstate(over="ignore", invalid="ignore"):
            out.append(quantize(x, fmt, rounding=mode, seed=5 if mode == "stochastic" else None))
    assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32))
    assert not (np.signbit(out[0]) & (out[0] == 0)).any()


def test_ml_dtypes_names_and_dtypes_resolve():
    from normlab.precision import get_format

    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"):
        assert get_format(getattr(ml_dtypes, name)).name == name
