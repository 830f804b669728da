"""Listing 16.4: fp16 overflows where bf16 keeps the range; loss scaling recovers tiny grads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import (
    fp16_overflows_but_bfloat16_keeps_range,
    loss_scaled_gradient,
    round_to_bfloat16,
)


def test_fp16_overflows_but_bfloat16_keeps_range():
    fp16, bf16 = fp16_overflows_but_bfloat16_keeps_range()
    assert fp16.dtype == np.float32 and bf16.dtype == np.float32
    assert np.isinf(fp16).all()  # 1e5 and 1e30 exceed fp16's max 65504
    assert np.isfinite(bf16).all()
    # round to nearest keeps the relative error within half an ulp: 2^-8 for 7 mantissa bits
    large = np.array([1e5, 1e30], np.float32).astype(np.float64)
    assert (np.abs(bf16 - large) / large <= 2.0**-8).all()
    assert bf16[0] == 99840.0  # 1e5 = 1.52587890625 * 2^16 -> 1.5234375 * 2^16 by hand


def test_round_to_bfloat16_matches_ml_dtypes_and_returns_float32():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10_000).astype(np.float32) * 1e3
    got = round_to_bfloat16(x)
    assert got.dtype == np.float32
    assert np.array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    # float64 inputs are rounded once: the tie-plus-tiny case rounds up, not to even
    assert round_to_bfloat16(np.array([1 + 2.0**-8 + 2.0**-40]))[0] == np.float32(1 + 2.0**-7)
    with pytest.raises(TypeError, match="float32 or float64"):
        round_to_bfloat16(np.array([1, 2]))


def test_loss_scaling_recovers_a_tiny_fp16_gradient():
    g = np.array([1e-8, -3e-9, 2e-4], np.float32)
    lost = loss_scaled_gradient(g, 1.0)  # without scaling 1e-8 underflows fp16 (min 6e-8)
    assert lost[0] == 0.0 and lost[1] == 0.0
    got = loss_scaled_gradient(g, 2.0**20)
    assert got.dtype == np.float32
    # scaled values are fp16 normals: relative error <= 2^-11 (half an ulp, 10 mantissa bits)
    assert np.all(np.abs(got - g) <= 2.0**-11 * np.abs(g))


def test_loss_scaling_overflow_shows_as_inf_and_bad_scale_rejected():
    got = loss_scaled_gradient(np.array([1.0], np.float32), 2.0**17)  # 131072 > 65504
    assert np.isinf(got[0])
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="scale must be > 0"):
            loss_scaled_gradient(np.ones(2, np.float32), bad)
    with pytest.raises(ValueError, match="finite"):
        loss_scaled_gradient(np.ones(2, np.float32), float("inf"))
    with pytest.raises(TypeError, match="floating"):
        loss_scaled_gradient(np.ones(2, np.int64), 2.0)
