"""Experiment 8 (fp8_formats): checks pass, and its key numbers recomputed independently."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.lab.experiments import fp8_formats as exp

E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # the paper's Table 1


@pytest.fixture(scope="module")
def quick(quick_results):
    return quick_results[exp.NAME]


def _draws(quick):
    # the experiment's documented draws: the sweep tensor first, then one tensor per step
    rng = np.random.default_rng(0)
    n, steps = quick.settings["n"], quick.settings["steps"]
    z = rng.standard_normal(n).astype(np.float32)
    return z, rng.standard_normal((steps, n)).astype(np.float32)


def _cast(x: np.ndarray, dtype, fmax: float) -> np.ndarray:
    # saturate first (ml_dtypes' E4M3FN cast gives NaN above 464, E5M2 gives inf), then cast
    return np.clip(x, -fmax, fmax).astype(dtype).astype(np.float64)


def _rel(x: np.ndarray, q: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(np.linalg.norm(q - x64) / np.linalg.norm(x64))


def test_quick_run_passes_every_check(quick):
    assert quick.passed and len(quick.checks) == 6
    assert set(quick.figures) == {"sweep", "drift"}


@pytest.mark.parametrize("k", [-24.0, -8.0, 0.0, 6.0, 12.0, 18.0])
def test_sweep_errors_recomputed_with_ml_dtypes(quick, k):
    # ml_dtypes' casts of the same tensor; rtol 1e-9: identical rounded values, only the
    # float64 norms are recomputed
    z, _ = _draws(quick)
    i = int(np.argmin(np.abs(np.array(quick.metrics["log2_scales"]) - k)))
    x = z * np.float32(2.0**k)
    got = quick.metrics["relative_error"]
    np.testing.assert_allclose(
        got["E4M3"][i], _rel(x, _cast(x, ml_dtypes.float8_e4m3fn, E4M3_MAX)), rtol=1e-9
    )
    np.testing.assert_allclose(
        got["E5M2"][i], _rel(x, _cast(x, ml_dtypes.float8_e5m2, E5M2_MAX)), rtol=1e-9
    )


def test_delayed_scaling_trace_recomputed(quick):
    # delayed scaling written out from its definition: step t uses scale = 448 / max of the
    # amaxes of the last 16 steps before t (scale 1 before any history), saturating cast;
    # rtol 1e-6: the scale is a float32 quotient on both sides, the error a float64 norm
    z_steps = _draws(quick)[1]
    log2_s = exp.drift_scales(quick.settings["steps"])
    history: list[float] = []
    delayed, current = [], []
    for z, e in zip(z_steps, log2_s, strict=True):
        x = z * np.float32(2.0**e)
        scale = np.float32(1.0)
        if history:
            scale = np.float32(E4M3_MAX) / np.float32(max(history[-16:]))
        q = _cast(x * scale, ml_dtypes.float8_e4m3fn, E4M3_MAX)
        delayed.append(_rel(x, q * np.float64(np.float32(1.0) / scale)))
        amax = np.float32(np.max(np.abs(x)))
        cur_scale = np.float32(E4M3_MAX) / amax
        qc = _cast(x * cur_scale, ml_dtypes.float8_e4m3fn, E4M3_MAX)
        current.append(_rel(x, qc * np.float64(np.float32(1.0) / cur_scale)))
        history.append(float(amax))
    np.testing.assert_allclose(quick.metrics["drift_error"]["delayed"], delayed, rtol=1e-6)
    np.testing.assert_allclose(quick.metrics["drift_error"]["current"], current, rtol=1e-6)


def test_one_mantissa_bit_halves_the_error(quick):
    # the raw numbers behind check 2: the best errors, within the check's [0.4, 0.6] band,
    # and E5M2's usable window 12 to 18 binades wider (the formats' ranges differ by 14)
    best = quick.checks[1].values["best_error"]
    assert 0.4 <= best["E4M3 scaled"] / best["E5M2 scaled"] <= 0.6
    width = quick.metrics["usable_binades"]
    assert 12 <= width["E5M2"] - width["E4M3"] <= 18


def test_table1_check_compares_with_the_papers_numbers(quick):
    # the paper's Table 1 written here, not read from the code: E4M3 448 / 2^-9, E5M2
    # 57344 / 2^-16; the extra range log2(57344 / 2^-16) - log2(448 / 2^-9) = 14 binades
    values = quick.checks[0].values
    assert values["formats"] == {"E4M3": (448.0, 2.0**-9), "E5M2": (57344.0, 2.0**-16)}
    assert values["extra_range"] == 14.0
    assert "448" in quick.checks[0].measured and "57344" in quick.checks[0].measured
