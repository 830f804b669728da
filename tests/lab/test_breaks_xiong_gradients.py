"""Fault injection: xiong_gradients must report FAIL (not PASS, not ERROR) when broken."""

from __future__ import annotations

from normlab.lab.experiments import xiong_gradients
from normlab.lab.result import Settings
from normlab.lab.runner import run_experiments
from normlab.nn import residual


def test_pre_post_swapped_fails(monkeypatch):
    assert "pre_post_swapped" in xiong_gradients.DETECTS
    original = residual.Residual.__init__

    def swapped(self, sublayer, norm, placement="pre", **kw):
        original(self, sublayer, norm, {"pre": "post", "post": "pre"}.get(placement, placement),
                 **kw)  # fmt: skip

    monkeypatch.setattr(residual.Residual, "__init__", swapped)
    (outcome,) = run_experiments(["xiong_gradients"], Settings("quick", 0))
    assert outcome.status == "fail", outcome.error
    checks = {c.claim.split(":")[0]: c for c in outcome.result.checks}
    # Post-LN's W1 growth (ratio 1.66 unbroken at this size) no longer holds
    assert not checks["Post-LN W1"].passed
    # and the contrast, the FAIL-type check, is what turns the status to FAIL
    contrast = checks["Post-LN's gradients lean further toward the top layers than Pre-LN's"]
    assert not contrast.passed and contrast.verdict == "FAIL"
