"""Fault injection: norm_speed must report FAIL (not PASS, not ERROR) when broken."""

from __future__ import annotations

from normlab.lab.experiments import norm_speed
from normlab.lab.result import Settings
from normlab.lab.runner import run_experiments
from normlab.norms import rms_norm


def test_rmsnorm_subtracting_the_mean_fails(monkeypatch):
    # RMSNorm turned into a LayerNorm without bias (the row mean removed first): a "faster"
    # RMSNorm that computes the wrong function must not pass on its timing
    assert "rmsnorm_subtracts_mean" in norm_speed.DETECTS
    reference = rms_norm._rms_norm_forward_ref

    def centred(x, weight, eps, offset, k):
        return reference(x - x.mean(axis=-1, keepdims=True), weight, eps, offset, k)

    monkeypatch.setattr(rms_norm, "_rms_norm_forward_ref", centred)
    (outcome,) = run_experiments(["norm_speed"], Settings("quick", 0))
    assert outcome.status == "fail", outcome.error
    numpy_correct = outcome.result.checks[0]
    assert numpy_correct.claim.startswith("numpy:") and not numpy_correct.passed
