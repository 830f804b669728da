"""FP8 per-tensor scaling: current scaling, Transformer Engine delayed-scaling traces by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab.precision.formats.format import FLOAT8_E4M3FN, FLOAT8_E5M2
from normlab.precision.scaled.fp8_scaling import (
    DelayedScaling,
    Fp8Meta,
    compute_scale,
    fp8_quantize,
    quantize_current_scaling,
)

F32_MAX = float(np.finfo(np.float32).max)


def _x(amax: float) -> np.ndarray:
    return np.array([amax / 4, -amax, 0.0], dtype=np.float32)


def _run(meta: Fp8Meta, amaxes: list[float]) -> list[float]:
    scales = []
    for a in amaxes:
        meta.quantize(_x(a))
        meta.update()
        scales.append(meta.scale)
    return scales


def test_compute_scale_rule() -> None:
    assert compute_scale(2.0, 448.0) == 224.0
    assert compute_scale(2.0, 448.0, margin=2) == 56.0
    assert compute_scale(2.0, 448.0, margin=-1) == 448.0
    for bad in (0.0, math.inf, math.nan):
        assert compute_scale(bad, 448.0, previous=3.0) == 3.0
    assert compute_scale(1e-40, 448.0) == F32_MAX  # 448 / 1e-40 overflows float32
    # float32 arithmetic: 448 / 3 = 149.333...; spacing 2^-16 in [128, 256):
    # 149.333... * 2^16 = 9786709.33 -> 9786709 * 2^-16
    assert compute_scale(3.0, 448.0) == 9786709 / 65536


def test_delayed_scaling_max_trace() -> None:
    # L = 3. Worked by hand: [history after recording] -> amax -> scale -> [after roll]
    # 1: [2,0,0] -> 2 -> 224 -> [0,0,2]      2: [8,0,2] -> 8 -> 56 -> [0,2,8]
    # 3: [1,2,8] -> 8 -> 56 -> [0,8,1]       4: [.5,8,1] -> 8 -> 56 -> [0,1,.5]
    # 5: [.25,1,.5] -> 1 -> 448 -> [0,.5,.25]
    meta = Fp8Meta(DelayedScaling(amax_history_len=3, amax_compute_algo="max"))
    assert meta.fmt is FLOAT8_E4M3FN and meta.scale == 1.0
    assert _run(meta, [2.0, 8.0, 1.0, 0.5, 0.25]) == [224.0, 56.0, 56.0, 56.0, 448.0]
    np.testing.assert_array_equal(meta.amax_history, [0.0, 0.5, 0.25])


def test_delayed_scaling_most_recent_trace() -> None:
    meta = Fp8Meta(DelayedScaling(amax_history_len=3, amax_compute_algo="most_recent"))
    assert _run(meta, [2.0, 8.0, 1.0, 0.5, 0.25]) == [224.0, 56.0, 448.0, 896.0, 1792.0]
    np.testing.assert_array_equal(meta.amax_history, [0.0, 0.5, 0.25])  # rolled the same way


def test_quantize_uses_the_current_scale_and_records_amax() -> None:
    meta = Fp8Meta(DelayedScaling(amax_history_len=4))
    meta.quantize(_x(2.0))
    meta.update()  # scale 224
    t = meta.quantize(np.array([8.0, 1.0], dtype=np.float32))
    assert t.scale == 224.0 and t.scale_inv == float(np.float32(1 / 224))
    # 8 * 224 = 1792 saturates to 448; 1 * 224 = 224 is exact in E4M3
    assert t.data.tolist() == [448.0, 224.0]
    meta.quantize(np.array([3.0], dtype=np.float32))  # a second use in the same step
    assert meta.amax_history[0] == 8.0  # running max within the step


def test_zero_inf_nan_amax_keep_scale() -> None:
    meta = Fp8Meta(DelayedScaling(amax_history_len=1, amax_compute_algo="most_recent"))
    with np.errstate(invalid="ignore", over="ignore"):
        scales = _run(meta, [2.0, 0.0, math.inf, 4.0])
    assert scales == [224.0, 224.0, 224.0, 112.0]
    # unfused "max" with a NaN: the NaN stays in the window for L updates, the scale is kept
    meta2 = Fp8Meta(DelayedScaling(amax_history_len=2, update="unfused"))
    meta2.quantize(_x(2.0))
    meta2.update()
    with np.errstate(invalid="ignore"):
        meta2.quantize(np.array([np.nan, 1.0], dtype=np.float32))
    meta2.update()
    assert meta2.scale == 224.0
    meta2.quantize(_x(4.0))
    meta2.update()
    assert meta2.scale == 224.0  # NaN still in the window
    meta2.quantize(_x(4.0))
    meta2.update()
    assert meta2.scale == 112.0


def test_margin_and_hybrid_formats() -> None:
    meta = Fp8Meta(DelayedScaling(margin=1, amax_history_len=2))
    assert _run(meta, [2.0]) == [112.0]
    grad = Fp8Meta(DelayedScaling(amax_history_len=2), role="backward")
    assert grad.fmt is FLOAT8_E5M2
    assert _run(grad, [2.0]) == [28672.0]  # 57344 / 2
    assert Fp8Meta(DelayedScaling(fp8_format="E4M3"), role="backward").fmt is FLOAT8_E4M3FN


def test_fp8_quantize_saturates_and_keeps_nan() -> None:
    x = np.array([1000.0, -1e6, np.inf, np.nan, 0.1], dtype=np.float32)
    t = fp8_quantize(x, "e4m3", 1.0)
    # 0.1 in E4M3: binade [2^-4, 2^-3) has spacing 2^-7; 0.1 / 2^-7 = 12.8 -> 13 * 2^-7
    np.testing.assert_array_equal(t.data, [448.0, -448.0, 448.0, np.nan, 13 / 128])
    e5 = fp8_quantize(x, "e5m2", 1.0)
    assert e5.data[1] == -57344.0 and e5.data[2] == 57344.0


def test_current_scaling_roundtrip() -> None:
    t = quantize_current_scaling(np.array([0.5, -2.0], np.float32))
    assert t.scale == 224.0 and t.data.tolist() == [112.0, -448.0]
    rng = np.random.default_rng(0)
    x = (rng.uniform(0.01, 1.0, 1000) * rng.choice([-1, 1], 1000) * 3e-3).astype(np.float32)
    t = quantize_current_scaling(x)
    assert np.max(np.abs(t.data)) == 448.0  # the amax lands on fp8 max
    # scaled values are >= 4.48 (normal E4M3): round-to-nearest error <= 2^-4 relative, plus
    # float32 rounding of x * scale and of the dequantisation (a few 2^-24)
    rel = np.abs(t.dequantize() - x) / np.abs(x)
    assert rel.max() <= 2.0**-4 * (1 + 1e-6)
    assert quantize_current_scaling(np.zeros(3, np.float32)).scale == 1.0


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError):
        DelayedScaling(fp8_format="E3M4")
    with pytest.raises(TypeError):
        DelayedScaling(margin=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fp8Meta(DelayedScaling(), role="sideways")
    with pytest.raises(ValueError):
        fp8_quantize(np.ones(2, np.float32), "e4m3", 0.0)
    with pytest.raises(ValueError):
        fp8_quantize(np.ones(2, np.float32), "e9m9", 1.0)
    meta = Fp8Meta(DelayedScaling(amax_history_len=2))
    with pytest.raises(TypeError):
        meta.quantize(np.array([1, 2]))
    assert meta.amax_history.tolist() == [0.0, 0.0] and meta.scale == 1.0
