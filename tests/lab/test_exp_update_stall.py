"""Experiment 3 (update_stall): checks pass, and its key numbers recomputed independently."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.lab.experiments import update_stall as exp


@pytest.fixture(scope="module")
def quick(quick_results):
    return quick_results[exp.NAME]


def test_quick_run_passes_every_check(quick):
    assert quick.passed and len(quick.checks) == 6
    assert set(quick.figures) == {"errors"}
    assert set(quick.metrics["tail_error"]) == set(exp.MODES)


def _swamp(dtype) -> int:
    # smallest power-of-two ratio r with x + x/r == x at x = 1, in the type's own arithmetic
    one = dtype(1.0)
    for k in range(1, 40):
        if dtype(one + dtype(2.0**-k)) == one:
            return 2**k
    raise AssertionError("no swamping")


def test_swamping_ratios_match_native_arithmetic(quick):
    # numpy float16 and ml_dtypes bfloat16 add with one correct rounding: an oracle that
    # shares no code with normlab.precision; exact equality (powers of two)
    expected = {"fp16": _swamp(np.float16), "bf16": _swamp(ml_dtypes.bfloat16)}
    assert expected == {"fp16": 2048, "bf16": 256}
    assert quick.metrics["swamping_ratio"] == expected


def test_storage_floor_recomputed_with_ml_dtypes(quick):
    # the same problem (first draws of the seed), w* rounded by ml_dtypes' cast; rtol 1e-12:
    # identical rounded values, only the float64 RMS is recomputed
    _, _, w_star = exp._problem(np.random.default_rng(0), quick.settings["d"])
    rounded = w_star.astype(ml_dtypes.bfloat16).astype(np.float64)
    floor = np.sqrt(np.mean((rounded - w_star) ** 2))
    np.testing.assert_allclose(quick.metrics["storage_floor"], floor, rtol=1e-12)


def test_round_to_nearest_stall_reproduced_with_ml_dtypes(quick):
    # plain gradient descent with the weights cast to bfloat16 after every step (ml_dtypes,
    # through float32: a rare double rounding may move one weight by an ulp), at the largest
    # step; the stalled error must agree within 10% (a single different rounding shifts
    # where a coordinate stalls by about one ulp out of ~10 ulps of error)
    a, b, w_star = exp._problem(np.random.default_rng(0), quick.settings["d"])
    lr = exp._LRS[0]
    w = np.zeros_like(w_star)
    for _ in range(2000):
        delta = (-lr * (a.T @ (a @ w - b))).astype(np.float32)
        w = (w + delta).astype(ml_dtypes.bfloat16).astype(np.float32)
    err = np.sqrt(np.mean((w.astype(np.float64) - w_star) ** 2))
    np.testing.assert_allclose(quick.metrics["final_error"]["nearest"][0], err, rtol=0.1)
    assert err > 5 * quick.metrics["storage_floor"]


def test_error_grows_as_the_step_shrinks(quick):
    # the claim restated from the raw numbers: 5x smaller step, >= 2.5x larger stalled error
    near = np.array(quick.metrics["tail_error"]["nearest"])
    assert np.all(near[1:] >= 2.5 * near[:-1])
    for mode in ("master", "kahan", "stochastic"):
        assert max(quick.metrics["tail_error"][mode]) <= 1.5 * quick.metrics["storage_floor"]

