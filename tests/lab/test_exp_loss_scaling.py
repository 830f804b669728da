"""Experiment 4 (loss_scaling): checks pass, and its key numbers recomputed independently."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.lab.experiments import loss_scaling as exp
from normlab.lab.result import Settings


@pytest.fixture(scope="module")
def quick(quick_results):
    return quick_results[exp.NAME]


def test_quick_run_has_no_failed_criterion(quick):
    # the paper's claims may be NOT REPRODUCED or, at the quick size, INCONCLUSIVE; every
    # mechanism check (flush monotone in S, the dynamic scaler works) holds
    assert len(quick.checks) == 6 and quick.verdict != "FAIL"
    assert [quick.checks[i].if_false for i in (1, 3, 4)] == ["FAIL"] * 3
    assert all(quick.checks[i].passed for i in (1, 3, 4))
    # the probe step at 2^40 was skipped and halved the scale (exact powers of two)
    assert quick.checks[4].values == {"skipped": True, "kept": True,
                                      "scale_after": 2.0 ** (exp.PROBE_EXPONENT - 1)}
    assert set(quick.figures) == {"histogram", "flushed", "training"}


def test_the_setup_is_the_documented_one(quick):
    # read off what ran (metrics.json "sizes"): Adam (AdamW without weight decay), He
    # normal weights (std over sqrt(2/fan_in): mean of 3 matrices of >= 1024 draws, 5%),
    # zero biases, the loss a mean over B x K outputs
    cfg = quick.settings
    assert cfg["optimizer"].startswith("AdamW (Adam)") and "full batch" in cfg["optimizer"]
    np.testing.assert_allclose(cfg["init_measured"]["std_over_he"], 1.0, rtol=0.05)
    assert cfg["init_measured"]["max_abs_bias"] == 0.0
    assert cfg["outputs_total"] == cfg["batch"] * cfg["outputs"] == cfg["head_outputs"] * 16
    doc = exp.__doc__ or ""
    for words in ("Adam", "He-initialised", "full-batch", "mean over"):
        assert words in doc, words


def _m(finals: dict, regime: float = 0.9, flushed0: float = 0.3) -> dict:
    """Synthetic measurements for checks(): only what the criteria read; `finals` holds
    each run's final loss per replicate (replicate 0 first)."""
    flushed = np.array([flushed0] + [0.0] * (len(exp.SCALE_EXPONENTS) - 1))
    overflow = np.array([0.0] * 10 + [0.5] * (len(exp.SCALE_EXPONENTS) - 10))
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in finals.items()}
    final = {k: float(v[0]) for k, v in arrays.items()}
    return {"flushed": flushed, "overflow": overflow, "first_over": 10, "final": final,
            "finals": arrays, "log_drop": {k: float(np.log10(1.0 / v)) for k, v in
                                           final.items()},
            "median_scale": 2.0**18, "applied": 0.98, "regime": regime,
            "probe": {"skipped": True, "kept": True, "scale_after": 2.0**39}}


def test_training_claims_are_decided_on_the_log_ratio_interval():
    # twelve replicates (MATCH_DECIDES_FROM), ln spread ~0.008: half-width ~0.005
    jitter = np.array([1.0, 1.01, 0.99, 1.005, 0.995, 1.0, 1.01, 0.99, 1.0, 1.002, 0.998,
                       1.0])
    fp32 = 1e-5 * jitter
    # unscaled 2x behind in every replicate, scaled equal: both claims PASS
    c = exp.checks(_m({"fp32": fp32, "fp16": 2 * fp32, "fp16+scaler": fp32}))
    assert (c[2].verdict, c[5].verdict) == ("PASS", "PASS")
    assert c[2].interval.estimate == pytest.approx(np.log(2.0))
    # unscaled level with fp32, scaled 1.5x above: both claims NOT REPRODUCED
    c = exp.checks(_m({"fp32": fp32, "fp16": fp32, "fp16+scaler": 1.5 * fp32}))
    assert (c[2].verdict, c[5].verdict) == ("NOT REPRODUCED", "NOT REPRODUCED")
    # gaps that swing across the limits from replicate to replicate: INCONCLUSIVE
    swing = np.array([1.0, 1.6, 0.9, 1.3] * 3)
    c = exp.checks(_m({"fp32": fp32, "fp16": fp32 * swing, "fp16+scaler": fp32 * swing}))
    assert (c[2].verdict, c[5].verdict) == ("INCONCLUSIVE", "INCONCLUSIVE")
    # eight (the default size) decide both claims, either way
    c = exp.checks(_m({"fp32": fp32[:8], "fp16": 2 * fp32[:8], "fp16+scaler": fp32[:8]}))
    assert (c[2].verdict, c[5].verdict) == ("PASS", "PASS")
    c = exp.checks(_m({"fp32": fp32[:8], "fp16": fp32[:8], "fp16+scaler": 1.5 * fp32[:8]}))
    assert (c[2].verdict, c[5].verdict) == ("NOT REPRODUCED", "NOT REPRODUCED")
    # four replicates (the quick size) do not decide: INCONCLUSIVE, saying so
    c = exp.checks(_m({"fp32": fp32[:4], "fp16": 2 * fp32[:4], "fp16+scaler": fp32[:4]}))
    assert (c[2].verdict, c[5].verdict) == ("INCONCLUSIVE", "INCONCLUSIVE")
    assert "not decided at this size" in c[2].measured
    assert "not decided at this size" in c[5].measured
    # part of the gradients flushing is judged on replicate 0's regime
    same = {"fp32": fp32, "fp16": fp32, "fp16+scaler": fp32}
    assert exp.checks(_m(same, regime=0.3, flushed0=0.01))[0].verdict == "INCONCLUSIVE"
    assert exp.checks(_m(same, regime=0.9, flushed0=0.01))[0].verdict == "NOT REPRODUCED"


def test_flushed_and_overflow_fractions_by_direct_count(quick):
    # numpy's own float16 cast (round to nearest even, inf on overflow) counts the flushed
    # and overflowing values; exact equality: the same integer counts over the same values
    g = exp.gradient_sample(Settings("quick", 0))
    nz = g[g != 0]
    assert nz.size == quick.metrics["nonzero_gradients"]
    flushed, overflow = [], []
    with np.errstate(over="ignore"):
        for e in exp.SCALE_EXPONENTS:
            h = (nz * np.float32(2.0**e)).astype(np.float16)
            flushed.append(np.count_nonzero(h == 0) / nz.size)
            overflow.append(np.count_nonzero(np.isinf(h)) / nz.size)
    assert quick.metrics["flushed_fraction"] == pytest.approx(flushed, rel=0, abs=0)
    assert quick.metrics["overflow_fraction"] == pytest.approx(overflow, rel=0, abs=0)
    # some values below fp16's smallest subnormal without scaling, none overflowing, and
    # values that overflow once S is large
    assert 0 < flushed[0] < 1 and overflow[0] == 0 and overflow[-1] > 0


def test_flushed_values_are_those_below_half_the_smallest_subnormal():
    # the rule behind the histogram's red band: |g| <= 2^-25 rounds to zero in fp16 (the
    # tie at exactly 2^-25 goes to the even neighbour, zero); exact equality of counts
    g = exp.gradient_sample(Settings("quick", 0))
    nz = np.abs(g[g != 0]).astype(np.float64)
    by_rule = np.count_nonzero(nz <= 2.0**-25)
    by_cast = np.count_nonzero(nz.astype(np.float32).astype(np.float16) == 0)
    assert by_rule == by_cast


def test_scale_trace_follows_the_dynamic_rules(quick):
    # GradScaler's rules: start at INIT_SCALE, each update halves (overflow), doubles (after
    # 50 clean steps) or keeps the scale; exact powers of two throughout
    trace = np.array(quick.metrics["scale_trace"])
    assert trace[0] == exp.INIT_SCALE
    steps = trace[1:] / trace[:-1]
    assert set(np.unique(steps)) <= {0.5, 1.0, 2.0}
    # every skipped step halves the next scale (the last step's backoff is not in the trace)
    assert np.count_nonzero(steps == 0.5) in (quick.metrics["skipped_steps"],
                                              quick.metrics["skipped_steps"] - 1)
    assert np.all(np.log2(trace) == np.round(np.log2(trace)))


def test_applied_fraction_is_the_share_of_steps_without_a_backoff(quick):
    # the criterion's "applied" recomputed from the trace: a skipped step is an overflow,
    # which halves the next scale (only the last step's backoff is not in the trace)
    trace = np.array(quick.metrics["scale_trace"])
    halvings = int(np.count_nonzero(trace[1:] / trace[:-1] == 0.5))
    steps = trace.size
    applied = quick.metrics["applied_fraction"]
    assert round((1 - applied) * steps) in (halvings, halvings + 1)
    assert applied >= 0.9
