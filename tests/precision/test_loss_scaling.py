"""DynamicLossScaler / StaticLossScaler: scripted traces worked by hand, bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision.training.loss_scaling import DynamicLossScaler, StaticLossScaler


def _trace(scaler: DynamicLossScaler, flags: list[bool]) -> list[float]:
    out = []
    for f in flags:
        scaler.update(f)
        out.append(scaler.scale)
    return out


def test_default_rules_scripted_trace() -> None:
    # init 2^16, growth every 3 clean steps, one halving per overflowing update.
    s = DynamicLossScaler(growth_interval=3)
    flags = [False, False, True, False, False, False, True, True, False, False, False]
    expected = [65536.0, 65536.0, 32768.0, 32768.0, 32768.0, 65536.0,
                32768.0, 16384.0, 16384.0, 16384.0, 32768.0]
    assert _trace(s, flags) == expected  # exact: powers of two
    assert s.state_dict()["_growth_tracker"] == 0


def test_growth_tracker_counts_and_resets() -> None:
    s = DynamicLossScaler(init_scale=4.0, growth_interval=4)
    s.update(False)
    s.update(False)
    assert s.state_dict()["_growth_tracker"] == 2
    s.update(True)  # an overflow zeroes the tracker
    assert s.state_dict()["_growth_tracker"] == 0
    assert s.scale == 2.0


def test_backoff_product_rounded_to_float32() -> None:
    # 65536 * 0.3 = 19660.8; float32 spacing at 2^14 is 2^-9, 19660.8 / 2^-9 = 10066329.6
    # rounds to 10066330 -> 10066330 * 2^-9 = 19660.80078125 (worked by hand).
    s = DynamicLossScaler(backoff_factor=0.3)
    s.update(True)
    assert s.scale == 19660.80078125


def test_growth_refused_when_not_finite_in_float32() -> None:
    s = DynamicLossScaler(init_scale=2.0**127, growth_interval=1)
    s.update(False)  # 2^128 overflows float32: refused, tracker still reset
    assert s.scale == 2.0**127
    assert s.state_dict()["_growth_tracker"] == 0
    s2 = DynamicLossScaler(init_scale=2.0**126, growth_interval=1)
    s2.update(False)
    assert s2.scale == 2.0**127


def test_growth_rounded_to_float32() -> None:
    # 3 * 1.1 = 3.3000000000000003 -> float32 nearest 3.299999952316284 (2^-22 spacing).
    s = DynamicLossScaler(init_scale=3.0, growth_factor=1.1, growth_interval=1)
    s.update(False)
    assert s.scale == 3.299999952316284


def test_unscale_multiplies_by_float32_reciprocal() -> None:
    s = DynamicLossScaler(init_scale=3.0)
    inv = np.float32(1.0 / 3.0)
    assert s.inv_scale == float(inv)
    x = np.arange(1, 200, dtype=np.float32) * np.float32(0.37)
    g = x.copy()
    assert s.unscale([g]) is False
    expected = (x.astype(np.float64) * np.float64(inv)).astype(np.float32)
    np.testing.assert_array_equal(g, expected, strict=True)  # exact: one float32 rounding
    # the multiplication is not the division: some elements must differ from x / 3
    assert np.any(g != x / np.float32(3.0))


def test_unscale_low_precision_grads_in_own_dtype() -> None:
    s = DynamicLossScaler(init_scale=2.0**10)
    g = np.array([2048.0, 3.0, -1024.0], dtype=ml_dtypes.bfloat16)
    assert s.unscale(g) is False
    assert g.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(g.astype(np.float32), [2.0, 3.0 / 1024, -1.0])  # exact
    g64 = np.array([1.0], dtype=np.float64)
    s.unscale([g64])
    assert g64[0] == 2.0**-10


def test_found_inf_checked_on_scaled_values_and_all_grads_unscaled() -> None:
    s = DynamicLossScaler(init_scale=4.0)
    a = np.array([8.0, np.nan], dtype=np.float32)
    b = np.array([4.0], dtype=np.float16)
    assert s.unscale([a, None, b]) is True
    np.testing.assert_array_equal(a, [2.0, np.nan])
    assert b[0] == 1.0
    with np.errstate(over="ignore"):
        big = np.array([np.float16(60000.0)], dtype=np.float16) * np.float16(2)
    assert s.unscale([big]) is True  # inf in the scaled fp16 gradient


def test_one_backoff_per_update() -> None:
    s = DynamicLossScaler(init_scale=64.0)
    s.update(np.float32(3.0))  # a summed found_inf count > 1 still backs off once
    assert s.scale == 32.0


def test_scale_loss_dtype() -> None:
    s = DynamicLossScaler(init_scale=1024.0)
    out = s.scale_loss(np.float16(0.5))
    assert isinstance(out, np.float16) and out == 512.0
    arr = s.scale_loss(np.array([1.0, 2.0], dtype=np.float32))
    assert arr.dtype == np.float32 and arr.tolist() == [1024.0, 2048.0]
    assert s.scale_loss(0.25) == 256.0


def test_hysteresis_trace() -> None:
    # hysteresis 2: first backoff on the 2nd overflow since start/growth; clean steps do not
    # restore the counter, growth does.
    s = DynamicLossScaler(init_scale=1024.0, growth_interval=2, hysteresis=2)
    flags = [True, False, True, True, False, False, True, True]
    expected = [1024.0, 1024.0, 512.0, 256.0, 256.0, 512.0, 512.0, 256.0]
    assert _trace(s, flags) == expected


def test_min_scale_floor() -> None:
    s = DynamicLossScaler(init_scale=4.0, min_scale=1.5)
    assert _trace(s, [True, True, True]) == [2.0, 1.5, 1.5]


def test_state_dict_roundtrip_and_gradscaler_keys() -> None:
    s = DynamicLossScaler(init_scale=256.0, growth_interval=5, hysteresis=3, min_scale=2.0)
    _trace(s, [False, False, True])
    sd = s.state_dict()
    for key in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"):
        assert key in sd
    t = DynamicLossScaler()
    t.load_state_dict(sd)
    assert t.state_dict() == sd
    # a GradScaler-style dict (no hysteresis keys) is accepted
    u = DynamicLossScaler(hysteresis=2)
    u.load_state_dict({"scale": 8.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                       "growth_interval": 7, "_growth_tracker": 6})
    assert (u.scale, u.growth_factor, u.growth_interval, u.hysteresis) == (8.0, 3.0, 7, 2)
    u.update(False)
    assert u.scale == 24.0


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"growth_factor": 1.0}, ValueError),
        ({"growth_factor": 0.5}, ValueError),
        ({"backoff_factor": 1.0}, ValueError),
        ({"backoff_factor": 0.0}, ValueError),
        ({"backoff_factor": -0.5}, ValueError),
        ({"growth_interval": 0}, ValueError),
        ({"growth_interval": 2.5}, TypeError),
        ({"init_scale": 0.0}, ValueError),
        ({"init_scale": -1.0}, ValueError),
        ({"init_scale": float("inf")}, ValueError),
        ({"init_scale": float("nan")}, ValueError),
        ({"init_scale": 1e39}, ValueError),  # overflows float32
        ({"init_scale": "1"}, TypeError),
        ({"hysteresis": 0}, ValueError),
        ({"min_scale": 0.0}, ValueError),
        ({"min_scale": 2.0**17}, ValueError),  # above init_scale
    ],
)
def test_bad_parameters(kwargs: dict, exc: type) -> None:
    with pytest.raises(exc):
        DynamicLossScaler(**kwargs)


def test_bad_input_changes_nothing() -> None:
    s = DynamicLossScaler(init_scale=8.0, growth_interval=3)
    s.update(False)
    before = s.state_dict()
    good = np.array([8.0], dtype=np.float32)
    with pytest.raises(TypeError):
        s.unscale([good, np.array([1, 2])])  # integer gradient
    assert good[0] == 8.0  # the float array was not unscaled either
    with pytest.raises(TypeError):
        s.unscale([good, [1.0]])  # not an ndarray: cannot be updated in place
    with pytest.raises(TypeError):
        s.update("yes")
    with pytest.raises(ValueError):
        s.load_state_dict({**before, "backoff_factor": 2.0})
    with pytest.raises(ValueError):
        s.load_state_dict({"scale": 1.0})
    assert s.state_dict() == before
    assert good[0] == 8.0


def test_static_loss_scaler() -> None:
    s = StaticLossScaler(128.0)
    assert s.scale_loss(0.5) == 64.0
    g = np.array([256.0, np.inf], dtype=np.float32)
    assert s.unscale([g]) is True
    assert g[0] == 2.0
    s.update(True)
    assert s.scale == 128.0
    with pytest.raises(ValueError):
        StaticLossScaler(0.0)
    with pytest.raises(ValueError):
        StaticLossScaler(float("nan"))


def test_update_without_argument_uses_recorded_unscale() -> None:
    s = DynamicLossScaler(init_scale=16.0, growth_interval=1)
    with pytest.raises(ValueError):
        s.update()  # nothing recorded yet
    assert s.scale == 16.0
    s.unscale({"w": np.array([np.inf], np.float32), "b": np.array([1.0], np.float32)})
    s.unscale([np.array([1.0], np.float32)])  # a clean second group: the OR is kept
    s.update()
    assert s.get_scale() == 8.0
    s.unscale([np.array([1.0], np.float32)])
    s.update()
    assert s.scale == 16.0
