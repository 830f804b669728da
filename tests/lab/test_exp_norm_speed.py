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
    assert backends[0] == "numpy" and len(result.checks) == 2 * len(backends)
    # correctness checks must pass; the timing checks are measurements of this machine and
    # are not asserted (no timing assertion in tests), only that they are real ratios
    assert all(c.passed for c in result.checks[::2])
    for c in result.checks[1::2]:  # the speed claim: decided on the median's interval
        assert c.interval is not None and c.interval.method == "median"
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


def test_load_bursts_widen_the_interval_but_do_not_flip_the_verdict():
    # a true ratio of 1.3 with multiplicative jitter, and a third of the repeats hit by
    # bursts of load on one call or the other (ratios x4 or /4): the verdict may become
    # INCONCLUSIVE, never NOT REPRODUCED
    rng = np.random.default_rng(7)
    for trial in range(200):
        r = 1.3 * np.exp(0.05 * rng.standard_normal(21))
        hit = rng.random(21) < 1 / 3
        r[hit] *= rng.choice([4.0, 0.25], size=int(hit.sum()))
        checks = exp._checks("numpy", {"ln": 0.0, "rms": 0.0},
                             {"ratio": float(np.median(r)), "ratios": list(r),
                              "ln_s": 1.0, "rms_s": 1.0})
        assert checks[1].verdict in ("PASS", "INCONCLUSIVE"), trial
