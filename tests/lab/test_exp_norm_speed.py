"""Experiment norm_speed: quick run (no timing asserted) and its float64 reference vs PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.lab.experiments import norm_speed as exp
from normlab.lab.result import NullProgress, Settings

torch = pytest.importorskip("torch")


def test_quick_run_checks_correctness_then_reports_ratios():
    result = exp.run(Settings("quick", 0), NullProgress())
    backends = result.settings["backends"]
    assert backends[0] == "numpy" and len(result.checks) == 3 * len(backends)
    # correctness checks must pass; the timing checks are measurements of this machine and
    # are not asserted (no timing assertion in tests), only that they are real ratios
    assert all(c.passed for c in result.checks[::3])
    for b in backends:
        assert 0 < result.metrics["times"][b]["ratio"] < np.inf


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_float64_reference_matches_pytorch_autograd(kind):
    # the experiment judges correctness against _reference: it must itself be right.
    # Both sides are float64 evaluations of the same formulas: rtol 1e-10.
    x, dout, g, b = exp._inputs(6, 16, 3)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    gt = torch.tensor(g, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    if kind == "ln":
        y = torch.nn.functional.layer_norm(xt, (16,), gt, bt, exp.EPS_LN)
    else:
        y = torch.nn.functional.rms_norm(xt, (16,), gt, exp.EPS_RMS)
    (y * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    theirs = [y.detach(), xt.grad, gt.grad] + ([bt.grad] if kind == "ln" else [])
    ours = exp._reference(kind, x, dout, g, b)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(o, t.numpy(), rtol=1e-10, atol=1e-12)


def test_sign_test_levels_recomputed_by_enumeration():
    # P(K >= k) for K ~ Binomial(n, 1/2), counted over all 2^n sign patterns (n = 15)
    import itertools

    n = 15
    counts = np.zeros(n + 1)
    for bits in itertools.product((0, 1), repeat=n):
        counts[sum(bits)] += 1
    for k in range(n + 1):
        assert exp._tail(n, k) == counts[k:].sum() / 2**n
    # 12 of 15 is the smallest k the one-sided 2.5% test accepts (P = 0.0176; 11: 0.059)
    assert exp.sign_test([1.1] * 12 + [0.9] * 3)[1] == "PASS"
    assert exp.sign_test([1.1] * 11 + [0.9] * 4)[1] == "INCONCLUSIVE"
    assert exp.sign_test([1.1] * 3 + [0.9] * 12)[1] == "NOT REPRODUCED"


def test_median_interval_covers_at_least_95_percent():
    # coverage of [r_(j), r_(n+1-j)] is 1 - 2 P(K < j); the chosen j is the largest with
    # coverage >= 95% (n = 21: j = 6, coverage 97.3%; j = 7 would give 92.2%)
    r = [float(i) for i in range(1, 22)]
    assert exp.median_interval(r) == (6.0, 16.0)
    cover = 1 - 2 * (1 - exp._tail(21, 6))
    assert cover >= 0.95 and 1 - 2 * (1 - exp._tail(21, 7)) < 0.95


def test_load_bursts_widen_the_interval_but_do_not_flip_the_verdict():
    # a true ratio of 1.3 with multiplicative jitter, and a third of the repeats hit by
    # bursts of load on one call or the other (ratios x4 or /4): the verdicts may become
    # INCONCLUSIVE, never NOT REPRODUCED
    rng = np.random.default_rng(7)
    for trial in range(200):
        r = 1.3 * np.exp(0.05 * rng.standard_normal(21))
        hit = rng.random(21) < 1 / 3
        r[hit] *= rng.choice([4.0, 0.25], size=int(hit.sum()))
        checks = exp._checks("numpy", {"ln": 0.0, "rms": 0.0},
                             {"ratio": float(np.median(r)), "ratios": list(r),
                              "ln_s": 1.0, "rms_s": 1.0})
        assert [c.verdict for c in checks[1:]] in (
            ["PASS", "PASS"], ["PASS", "INCONCLUSIVE"], ["INCONCLUSIVE", "PASS"],
            ["INCONCLUSIVE", "INCONCLUSIVE"]), trial
