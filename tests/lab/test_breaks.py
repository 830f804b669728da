"""Fault injection: break one mechanism of the library, the lab must report FAIL.

A criterion that cannot fail proves nothing. Each test below breaks one mechanism the
way a plausible bug would (monkeypatching the library for the duration of the test),
runs the experiment that claims to detect it at its quick size, and asserts the status
"fail": not "pass" (the break went unnoticed) and not "error" (the experiment crashed
instead of judging). Every break here is listed in the experiment's ``DETECTS``, which the
report prints; experiments added later keep their break tests in
``test_breaks_<experiment>.py``. The tests at the bottom check that every experiment
declares ``DETECTS`` and that each break the lab must catch is declared somewhere.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import normlab._stats
from normlab import _backend
from normlab.lab.experiments import EXPERIMENTS, load
from normlab.lab.result import Settings
from normlab.lab.runner import run_experiments
from normlab.nn.container import Residual
from normlab.precision import DynamicLossScaler, Format, Fp8Meta, LowPrecisionUpdater, MasterWeights
from normlab.precision.scaled.fp8_scaling import compute_scale

QUICK = Settings("quick", 0)


def _status(name: str) -> str:
    (outcome,) = run_experiments([name], QUICK)
    assert outcome.status != "error", outcome.error  # a break must be judged, not crash
    return outcome.status


def _replace_everywhere(monkeypatch: pytest.MonkeyPatch, original: Any, fake: Any) -> int:
    """Point every ``normlab`` module attribute that holds ``original`` at ``fake``.

    Modules import functions and constants by name, so patching only the defining module
    would miss the copies; this finds them all (however the library is laid out).
    """
    count = 0
    for mod in list(sys.modules.values()):
        if not getattr(mod, "__name__", "").startswith("normlab"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                monkeypatch.setattr(mod, attr, fake)
                count += 1
    assert count > 0, f"{original!r} is not used by any normlab module"
    return count


def test_unbroken_experiments_are_not_failing():
    # the baseline every break is measured against: no FAIL without a break
    outcomes = run_experiments(["dropout_stats", "batch_vs_layer", "fp8_formats",
                                "stats_precision"], QUICK)
    assert [o.status for o in outcomes] == ["pass"] * 4


# --- residual placement -------------------------------------------------------------


def _swap_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    init = Residual.__init__

    def swapped(self: Residual, sublayer: Any, norm: Any, placement: str = "pre") -> None:
        init(self, sublayer, norm, {"pre": "post", "post": "pre"}[placement])

    monkeypatch.setattr(Residual, "__init__", swapped)


def test_swapped_placement_fails_xiong_init(monkeypatch):
    _swap_placements(monkeypatch)
    assert _status("xiong_init") == "fail"


def test_swapped_placement_fails_training_stability(monkeypatch):
    _swap_placements(monkeypatch)
    (outcome,) = run_experiments(["training_stability"], QUICK)
    assert outcome.status == "fail", outcome.error
    c1, c2 = outcome.result.checks[:2]  # type: ignore[union-attr]
    # the mechanism check FAILs: "Pre-LN" (now Post-LN) stalls where the baseline trains;
    # the comparison claim, which holds unbroken, no longer passes
    assert c1.verdict == "FAIL" and not c2.passed


# --- weight updates -------------------------------------------------------------------


def test_master_weights_off_fails_update_stall(monkeypatch):
    refresh = MasterWeights.refresh

    def rounded_masters(self: MasterWeights) -> None:
        refresh(self)
        for w, m in zip(self.working, self.masters, strict=True):
            m.data[...] = w.data  # the "fp32" master now holds only the bf16 value

    monkeypatch.setattr(MasterWeights, "refresh", rounded_masters)
    assert _status("update_stall") == "fail"


def test_stochastic_rounding_as_nearest_fails_update_stall(monkeypatch):
    q = LowPrecisionUpdater._q

    def nearest(self: LowPrecisionUpdater, x: np.ndarray, rounding: str = "nearest") -> Any:
        return q(self, x, "nearest")

    monkeypatch.setattr(LowPrecisionUpdater, "_q", nearest)
    assert _status("update_stall") == "fail"


# --- dropout --------------------------------------------------------------------------


def test_dropout_without_rescaling_fails_dropout_stats(monkeypatch):
    import normlab.dropout

    real = normlab.dropout.inverted_dropout

    def unscaled(x: Any, p: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        out, keep = real(x, p, rng)
        return out * (1.0 - p), keep  # the survivors keep their value: no 1/(1-p)

    _replace_everywhere(monkeypatch, real, unscaled)
    assert _status("dropout_stats") == "fail"


# --- loss scaling ---------------------------------------------------------------------


def test_scaler_that_never_backs_off_fails_loss_scaling(monkeypatch):
    update = DynamicLossScaler.update

    def no_backoff(self: DynamicLossScaler, found_inf: Any = None) -> None:
        scale = self.scale
        update(self, found_inf)
        self._scale = max(self._scale, scale)  # growth still happens, backoff never

    monkeypatch.setattr(DynamicLossScaler, "update", no_backoff)
    assert _status("loss_scaling") == "fail"


def test_loss_scale_fixed_at_one_fails_loss_scaling(monkeypatch):
    init, update = DynamicLossScaler.__init__, DynamicLossScaler.update

    def at_one(self: DynamicLossScaler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._scale = 1.0

    def stay(self: DynamicLossScaler, found_inf: Any = None) -> None:
        update(self, found_inf)
        self._scale = 1.0

    monkeypatch.setattr(DynamicLossScaler, "__init__", at_one)
    monkeypatch.setattr(DynamicLossScaler, "update", stay)
    assert _status("loss_scaling") == "fail"


# --- statistics -----------------------------------------------------------------------


def _naive_mean_var(x: np.ndarray, axes: Any) -> tuple[np.ndarray, np.ndarray]:
    axes = tuple(axes)
    mean = np.mean(x, axis=axes, keepdims=True)
    return mean, np.maximum(np.mean(x * x, axis=axes, keepdims=True) - mean * mean, 0)


def test_naive_variance_in_the_reference_fails_stats_precision(monkeypatch):
    _replace_everywhere(monkeypatch, normlab._stats.mean_var, _naive_mean_var)
    assert _status("stats_precision") == "fail"


def test_naive_variance_in_the_kernel_fails_stats_precision(monkeypatch):
    pytest.importorskip("numba")  # without numba there is no kernel to break
    real = _backend.kernel("layer_norm_forward")  # loads the kernels (registers them)
    assert real is not None

    def naive_kernel(x: np.ndarray, gamma: Any, beta: Any, eps: float, k: int) -> Any:
        result = real(x, gamma, beta, eps, k)
        if result is NotImplemented:
            return result
        out, cache = result
        mean, var = _naive_mean_var(x, range(x.ndim - k, x.ndim))
        rstd = (1.0 / np.sqrt(var + eps)).astype(x.dtype)
        out = ((x - mean) * rstd).astype(x.dtype)
        if gamma is not None:
            out = out * gamma
        if beta is not None:
            out = out + beta
        lead = x.shape[: x.ndim - k]
        return out, cache._replace(mean=mean.reshape(lead), rstd=rstd.reshape(lead))

    monkeypatch.setitem(_backend._REGISTRY, "layer_norm_forward", naive_kernel)
    # the reference alone is still right: only the kernel's check can catch this
    (outcome,) = run_experiments(["stats_precision"], QUICK)
    verdicts = [c.verdict for c in outcome.result.checks]  # type: ignore[union-attr]
    assert outcome.status == "fail" and verdicts == ["PASS", "PASS", "FAIL"]


# --- BatchNorm ------------------------------------------------------------------------


def test_batchnorm_eval_on_batch_statistics_fails_batch_vs_layer(monkeypatch):
    import normlab.nn.batchnorm

    real = normlab.nn.batchnorm.batch_norm_forward

    def always_training(x: Any, gamma: Any, beta: Any, rm: Any, rv: Any, training: bool,
                        *args: Any, **kwargs: Any) -> Any:
        return real(x, gamma, beta, rm, rv, True, *args, **kwargs)

    monkeypatch.setattr(normlab.nn.batchnorm, "batch_norm_forward", always_training)
    assert _status("batch_vs_layer") == "fail"


# --- FP8 ------------------------------------------------------------------------------


def test_delayed_scaling_with_the_current_amax_fails_fp8_formats(monkeypatch):
    quantize = Fp8Meta.quantize

    def current(self: Fp8Meta, x: Any) -> Any:
        amax = float(np.max(np.abs(np.asarray(x, np.float64))))
        self.scale = compute_scale(amax, self.fmt.max, self.recipe.margin, self.scale)
        return quantize(self, x)

    monkeypatch.setattr(Fp8Meta, "quantize", current)
    assert _status("fp8_formats") == "fail"


def test_e4m3_max_240_fails_fp8_formats(monkeypatch):
    from normlab.precision import FLOAT8_E4M3FN

    ieee = Format("float8_e4m3", 4, 3)  # the IEEE-style E4M3: infinities, max 240
    assert ieee.max == 240.0
    _replace_everywhere(monkeypatch, FLOAT8_E4M3FN, ieee)
    exp = load("fp8_formats")
    monkeypatch.setitem(exp.FORMATS, "E4M3", ieee)
    assert _status("fp8_formats") == "fail"


# --- the contract ---------------------------------------------------------------------


def test_every_experiment_declares_what_it_detects():
    for name in EXPERIMENTS:
        detects = load(name).DETECTS
        assert isinstance(detects, tuple) and all(isinstance(d, str) and d for d in detects)


def test_every_break_of_the_issue_is_detected_somewhere():
    # the ten breaks the lab must catch, each in the DETECTS of some experiment
    text = " ".join(d.lower() for name in EXPERIMENTS for d in load(name).DETECTS)
    for words in ("placements swapped", "master weights off", "stochastic rounding",
                  "1/(1-p)", "never backs off", "fixed at 1", "reference", "kernel",
                  "eval mode", "current amax", "e4m3 max"):
        assert words in text, words

