"""Loss scaler state: what load_state_dict accepts, what it refuses (changing nothing),
update(new_scale=...) checks, and non-native byte order.

Expected scales are float32 values derived by hand (powers of two, float32 rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from normlab.precision import DynamicLossScaler, StaticLossScaler

TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _scaler() -> DynamicLossScaler:
    s = DynamicLossScaler(init_scale=64.0, growth_interval=4, hysteresis=2, min_scale=2.0)
    s.update(False)
    s.update(True)  # hysteresis 2: no backoff yet, tracker 1
    s.update(False)
    return s


def test_scale_zero_from_backoff_underflow_round_trips() -> None:
    s = DynamicLossScaler(init_scale=2.0**-149, growth_interval=10)  # smallest float32
    s.update(True)  # 2^-150 rounds to 0 in float32 (ties to even)
    assert s.scale == 0.0
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    t.update(False)  # growth of 0 stays 0, as in GradScaler
    assert t.scale == 0.0


def test_zero_d_arrays_from_np_load_are_accepted() -> None:
    s = _scaler()
    state = {k: np.asarray(v) for k, v in s.state_dict().items()}
    t = DynamicLossScaler()
    t.load_state_dict(state)
    assert t.state_dict() == s.state_dict()
    assert all(type(v) in (int, float) for v in t.state_dict().values())


def test_torch_dict_keeps_extension_settings_and_checks_min_scale() -> None:
    s = DynamicLossScaler(hysteresis=3, min_scale=4.0)
    torch_like = {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 10, "_growth_tracker": 9}
    s.load_state_dict(torch_like)
    assert (s.scale, s.hysteresis, s.min_scale) == (8.0, 3, 4.0)
    before = s.state_dict()
    with pytest.raises(ValueError, match="min_scale"):
        s.load_state_dict({**torch_like, "scale": 2.0})  # below the kept floor of 4
    assert s.state_dict() == before
    # a normlab dict without min_scale means no floor
    ours = DynamicLossScaler(init_scale=8.0).state_dict()
    s.load_state_dict(ours)
    assert s.min_scale is None


BAD = [
    ({"min_scale": 128.0}, ValueError, "min_scale"),  # min_scale > scale: an overflow would grow it
    ({"scale": -1.0}, ValueError, ">= 0"),
    ({"scale": float("nan")}, ValueError, "finite"),
    ({"scale": 1e39}, ValueError, "float32"),
    ({"scale": "8"}, TypeError, "scale"),
    ({"scale": np.ones(2)}, ValueError, "0-d"),
    ({"growth_factor": 1.0}, ValueError, "growth_factor"),
    ({"backoff_factor": 1.5}, ValueError, "backoff_factor"),
    ({"growth_interval": 0}, ValueError, "growth_interval"),
    ({"_growth_tracker": 4}, ValueError, "< growth_interval"),
    ({"_growth_tracker": -1}, ValueError, "_growth_tracker"),
    ({"_growth_tracker": 1.0}, TypeError, "integer"),
    ({"hysteresis": 0}, ValueError, "hysteresis"),
    ({"_hysteresis_tracker": 3}, ValueError, "<= hysteresis"),
    ({"extra": 1}, ValueError, "unexpected"),
]


@pytest.mark.parametrize(("change", "exc", "match"), BAD)
def test_bad_state_is_rejected_and_changes_nothing(change: dict[str, Any], exc: type,
                                                   match: str) -> None:
    s = _scaler()
    good = s.state_dict()
    s.unscale([np.array([np.inf], np.float32)])  # a recorded overflow must survive too
    with pytest.raises(exc, match=match):
        s.load_state_dict({**good, **change})
    assert s.state_dict() == good
    s.update()
    assert s.state_dict()["_hysteresis_tracker"] == 0  # the recorded overflow was used


@pytest.mark.parametrize("state", [{}, {"scale": 1.0}, [("scale", 1.0)], None])
def test_malformed_states(state: Any) -> None:
    s = _scaler()
    good = s.state_dict()
    with pytest.raises((TypeError, ValueError)):
        s.load_state_dict(state)
    assert s.state_dict() == good


def test_update_new_scale_checks() -> None:
    s = DynamicLossScaler(init_scale=64.0, growth_interval=3, min_scale=2.0)
    s.update(False)
    s.update(new_scale=np.array([[100.1]]))  # any 1-element array, rounded to float32
    assert s.scale == float(np.float32(100.1))
    assert s.state_dict()["_growth_tracker"] == 1  # kept, as in GradScaler
    before = s.state_dict()
    for bad, exc in [(1.0, ValueError), (float("inf"), ValueError), (-4.0, ValueError),
                     (np.ones(2), ValueError), ("8", TypeError), (1e39, ValueError)]:
        with pytest.raises(exc):
            s.update(new_scale=bad)  # 1.0 is below min_scale = 2
    with pytest.raises(ValueError, match="not both"):
        s.update(True, new_scale=8.0)
    assert s.state_dict() == before
    s.unscale([np.array([np.inf], np.float32)])
    s.update(new_scale=8.0)  # drops the recorded overflow, as torch clears its found_inf
    with pytest.raises(ValueError, match="needs found_inf"):
        s.update()
    assert s.scale == 8.0


def test_static_scaler_state() -> None:
    s = StaticLossScaler(128.0)
    s.load_state_dict({"scale": np.array(32.0)})
    assert s.state_dict() == {"scale": 32.0}
    for bad in [{"scale": 0.0}, {"scale": 8.0, "growth_factor": 2.0}, {}]:
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    assert s.scale == 32.0


def test_big_endian_gradients_are_unscaled_in_float64() -> None:
    s = DynamicLossScaler(init_scale=3.0)  # 1/3 is inexact: float32 and float64 differ
    vals = np.array([1.0 + 2.0**-40, 7.0, -5.5])
    native, swapped = vals.copy(), vals.astype(">f8")
    s.unscale([native])
    s.unscale([swapped])
    assert swapped.dtype == np.dtype(">f8")
    np.testing.assert_array_equal(swapped.astype(np.float64), native)
    assert native[0] != np.float32(native[0])  # the float64 result kept its low bits
    loss = s.scale_loss(np.array(1.0 + 2.0**-40, dtype=">f8"))
    assert float(loss) == (1.0 + 2.0**-40) * 3.0
