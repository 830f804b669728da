"""Master weights, the guarded mixed-precision step, and low-precision weight updates."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from normlab.nn.optim import SGD, AdamW
from normlab.precision.training.loss_scaling import DynamicLossScaler, StaticLossScaler
from normlab.precision.training.mixed_step import (
    LowPrecisionUpdater,
    MasterWeights,
    clip_grad_norm,
    mixed_precision_step,
)


def _param(values: list[float], dtype: type = np.float32) -> SimpleNamespace:
    return SimpleNamespace(data=np.array(values, dtype=dtype), grad=None)


def test_master_keeps_float32_working_copy_rounded() -> None:
    p = _param([1 + 2.0**-10, 3.0])
    mw = MasterWeights([p], "bf16")
    assert mw.masters[0].data.dtype == np.float32
    assert mw.masters[0].data.tolist() == [1 + 2.0**-10, 3.0]
    assert p.data.tolist() == [1.0, 3.0]  # bf16: 2^-10 is below half an ulp (2^-8) of 1
    q = _param([1.0], ml_dtypes.bfloat16)  # a bf16 working array is written in its dtype
    MasterWeights([q], "bf16")
    assert q.data.dtype == ml_dtypes.bfloat16


def test_small_updates_survive_in_master_not_in_bf16() -> None:
    # 16 SGD steps of lr * g = 2^-10 each: the master reaches 1 + 2^-6 exactly (representable
    # in bf16); round-to-nearest bf16 weights never move (each update < half an ulp).
    p = _param([1.0])
    mw = MasterWeights([p], "bf16")
    opt = SGD(mw.masters, lr=2.0**-10)
    scaler = StaticLossScaler(1.0)
    pure = np.ones(1, np.float32)
    nearest = LowPrecisionUpdater("bf16", "nearest")
    kahan_w = np.ones(1, np.float32)
    kahan = LowPrecisionUpdater("bf16", "kahan")
    for _ in range(16):
        p.grad = np.array([-1.0], np.float32)
        assert not mixed_precision_step(mw, opt, scaler).skipped
        nearest.apply(pure, np.array([2.0**-10], np.float32))
        kahan.apply(kahan_w, np.array([2.0**-10], np.float32))
    assert mw.masters[0].data[0] == 1 + 2.0**-6
    assert p.data[0] == 1 + 2.0**-6
    assert pure[0] == 1.0
    assert kahan_w[0] == 1 + 2.0**-6  # compensated: the lost parts are carried forward


def test_overflow_skips_the_step_and_only_the_scaler_changes() -> None:
    p = _param([1.0, 2.0])
    mw = MasterWeights([p], "fp16")
    opt = AdamW(mw.masters, lr=0.1)
    scaler = DynamicLossScaler(init_scale=1024.0)
    p.grad = np.array([np.inf, 1.0], np.float32)
    res = mixed_precision_step(mw, opt, scaler, max_norm=1.0)
    assert res.skipped and res.scale == 512.0 and res.grad_norm is None
    assert mw.masters[0].data.tolist() == [1.0, 2.0] and p.data.tolist() == [1.0, 2.0]
    assert opt.state == {}


def test_unscale_happens_before_clipping() -> None:
    # true gradient (3, 4): norm 5. Scaled by 2^12 it has norm 20480. Clipping to 1 after
    # unscaling scales it by 1 / (5 + 1e-6); the SGD update is lr * g * coef.
    p = _param([0.0, 0.0])
    mw = MasterWeights([p], "fp32")
    opt = SGD(mw.masters, lr=1.0)
    scaler = DynamicLossScaler(init_scale=2.0**12)
    p.grad = np.array([3.0, 4.0], np.float32) * np.float32(2.0**12)
    res = mixed_precision_step(mw, opt, scaler, max_norm=1.0)
    assert res.grad_norm == pytest.approx(5.0, rel=1e-12)  # exact inputs: only float64 sqrt
    # float32 arithmetic on O(1) values: 1e-6 relative
    np.testing.assert_allclose(mw.masters[0].data, [-0.6, -0.8], rtol=1e-6)


def test_clip_grad_norm_by_hand() -> None:
    g = [np.array([3.0], np.float32), None, np.array([4.0], np.float32)]
    assert clip_grad_norm(g, 10.0) == 5.0
    assert g[0][0] == 3.0  # below the threshold: unchanged
    assert clip_grad_norm(g, 2.5) == 5.0
    np.testing.assert_allclose([g[0][0], g[2][0]], [1.5, 2.0], rtol=1e-6)  # float32 coef
    with pytest.raises(ValueError):
        clip_grad_norm(g, 0.0)


def test_fp16_training_recovers_from_overflow() -> None:
    # minimise 0.5 * ||w - t||^2 with an fp16 working copy; the first scaled gradient
    # (2^16 * ~1) overflows fp16 (max 65504): that step is skipped and the scale halves.
    rng = np.random.default_rng(0)
    t = rng.uniform(1.0, 2.0, 8).astype(np.float32)
    p = _param([0.0] * 8)
    mw = MasterWeights([p], "fp16")
    opt = AdamW(mw.masters, lr=0.05, weight_decay=0.0)
    scaler = DynamicLossScaler(growth_interval=50)
    results = []
    for _ in range(200):
        g = (p.data - t) * np.float32(scaler.scale)  # backward of the scaled loss
        with np.errstate(over="ignore"):
            p.grad = g.astype(np.float16).astype(np.float32)  # an fp16 gradient buffer
        results.append(mixed_precision_step(mw, opt, scaler))
    assert results[0].skipped and results[0].scale == 2.0**15
    assert not results[1].skipped  # max t = 1.913 here: 2^15 * 1.913 = 62681 < 65504
    # fp16 working copy of values in [1, 2): half-ulp 2^-11; AdamW settles within ~lr/10
    np.testing.assert_allclose(p.data, t, atol=0.02)


def test_stochastic_update_is_unbiased() -> None:
    # 1 + 2^-10 in bf16: neighbours 1 and 1 + 2^-7, P(up) = 1/8. n = 20000 draws:
    # std of the fraction = sqrt(p(1-p)/n) = 0.0023; tolerance 5 sigma.
    n = 20000
    w = np.ones(n, np.float32)
    up = LowPrecisionUpdater("bf16", "stochastic", rng=np.random.default_rng(5))
    up.apply(w, np.full(n, 2.0**-10, np.float32))
    assert set(np.unique(w).tolist()) <= {1.0, 1 + 2.0**-7}
    frac = np.mean(w > 1.0)
    assert abs(frac - 0.125) < 5 * np.sqrt(0.125 * 0.875 / n)


def test_kahan_compensation_in_format() -> None:
    w = np.ones(2, np.float32)
    up = LowPrecisionUpdater("bf16", "kahan")
    up.apply(w, np.array([2.0**-10, 0.5], np.float32))
    # first weight: s = 1, c = (1 - 1) - 2^-10; second: 1.5 exact, c = 0
    assert up.compensation(w).tolist() == [-(2.0**-10), 0.0]
    assert w.tolist() == [1.0, 1.5]


def test_bad_input_changes_nothing() -> None:
    with pytest.raises(ValueError):
        LowPrecisionUpdater("bf16", "round")
    with pytest.raises(TypeError):
        LowPrecisionUpdater("bf16", "stochastic")  # no rng
    with pytest.raises(ValueError):
        LowPrecisionUpdater("bf17")
    up = LowPrecisionUpdater("bf16")
    w = np.ones(3, np.float32)
    with pytest.raises(ValueError):
        up.apply(w, np.ones(2, np.float32))
    with pytest.raises(TypeError):
        up.apply([1.0, 2.0], np.ones(2, np.float32))
    assert w.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        MasterWeights([], "bf16")
    p = _param([1.0])
    mw = MasterWeights([p], "bf16")
    scaler = DynamicLossScaler(init_scale=8.0)
    p.grad = np.array([8.0], np.float32)
    with pytest.raises(ValueError):
        mixed_precision_step(mw, SGD(mw.masters, lr=0.1), scaler, max_norm=-1.0)
    assert p.grad[0] == 8.0 and scaler.scale == 8.0  # not unscaled, scaler untouched
    p.grad = np.array([8.0, 8.0], np.float32)  # wrong shape
    with pytest.raises(ValueError):
        mixed_precision_step(mw, SGD(mw.masters, lr=0.1), scaler)
    assert p.grad.tolist() == [8.0, 8.0] and scaler.scale == 8.0


def test_master_weights_big_endian_params_match_native() -> None:
    vals = np.array([1.0 + 2.0**-30, -3.25, 1e-3])
    results = []
    for dt in ("<f8", ">f8"):
        p = SimpleNamespace(data=vals.astype(dt), grad=None)
        mw = MasterWeights([p], "bf16")
        opt = AdamW(mw.masters, lr=0.01)
        p.grad = np.array([0.5, -0.25, 2.0], dtype=dt) * 64.0
        assert not mixed_precision_step(mw, opt, DynamicLossScaler(64.0)).skipped
        assert p.data.dtype == np.dtype(dt)
        results.append((p.data.astype(np.float64), mw.masters[0].data.copy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_mixed_precision_step_validates_before_unscaling() -> None:
    p = SimpleNamespace(data=np.ones(2, np.float32), grad=None)
    mw = MasterWeights([p], "bf16")
    scaler = DynamicLossScaler(4.0)
    p.grad = np.full(2, 4.0, np.float32)
    wrong = SGD([p], lr=0.1)  # built on the working parameters: refresh would undo it
    for args, exc, match in [
        ((mw, wrong, scaler), ValueError, "master.masters"),
        ((mw, object(), scaler), TypeError, "optimizer"),
        ((mw, SGD(mw.masters, lr=0.1), object()), TypeError, "scaler"),
        (([p], SGD(mw.masters, lr=0.1), scaler), TypeError, "MasterWeights"),
    ]:
        with pytest.raises(exc, match=match):
            mixed_precision_step(*args)
    with pytest.raises(ValueError, match="max_norm"):
        mixed_precision_step(mw, SGD(mw.masters, lr=0.1), scaler, max_norm=0.0)
    assert p.grad.tolist() == [4.0, 4.0] and scaler.state_dict()["_growth_tracker"] == 0


def test_clip_grad_norm_checks_every_entry_first() -> None:
    g0 = np.full(2, 10.0, np.float32)
    ro = np.ones(2, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"grads\[1\] must be writeable"):
        clip_grad_norm([g0, ro], 1.0)
    with pytest.raises(TypeError, match=r"grads\[1\]"):
        clip_grad_norm([g0, [1.0, 2.0]], 1.0)
    with pytest.raises(ValueError, match="eps"):
        clip_grad_norm([g0], 1.0, eps=-1.0)
    assert g0.tolist() == [10.0, 10.0]


def test_master_weights_load_state_checks() -> None:
    p = SimpleNamespace(data=np.ones(3, np.float32), grad=None)
    mw = MasterWeights([p], "bf16")
    good = mw.state_dict()
    assert sorted(good) == ["masters.0", "working.0"]
    for bad, exc in [({**good, "masters.1": np.ones(3)}, ValueError),
                     ({"masters.0": good["masters.0"]}, ValueError),
                     ({**good, "masters.0": np.ones(4)}, ValueError),
                     ({**good, "working.0": np.array([1, 2, 3])}, TypeError),
                     ([1], TypeError)]:
        with pytest.raises(exc):
            mw.load_state_dict(bad)
    p.data.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        mw.load_state_dict({"masters.0": np.full(3, 2.0), "working.0": np.full(3, 2.0)})
    assert mw.masters[0].data.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="saturate"):
        MasterWeights([p], "bf16", saturate=1)
    with pytest.raises(TypeError, match="rng"):
        MasterWeights([p], "bf16", rng=0)


def test_low_precision_updater_read_only_weights_change_nothing() -> None:
    up = LowPrecisionUpdater("bf16", "kahan")
    w = np.ones(2, np.float32)
    up.apply(w, np.full(2, 2.0**-10))
    comp = up.compensation(w).copy()
    w.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        up.apply(w, np.full(2, 2.0**-10))
    np.testing.assert_array_equal(up.compensation(w), comp)
