"""Fault injection: residual_depth must report FAIL (not PASS, not ERROR) when broken."""

from __future__ import annotations

import pytest

from normlab.lab.experiments import residual_depth
from normlab.lab.result import Settings
from normlab.lab.runner import run_experiments
from normlab.nn import residual


def _swap_pre_post(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Residual built as "pre" becomes "post" and vice versa."""
    original = residual.Residual.__init__

    def swapped(self, sublayer, norm, placement="pre", **kw):
        original(self, sublayer, norm, {"pre": "post", "post": "pre"}.get(placement, placement),
                 **kw)  # fmt: skip

    monkeypatch.setattr(residual.Residual, "__init__", swapped)


def test_pre_post_swapped_fails(monkeypatch):
    assert "pre_post_swapped" in residual_depth.DETECTS
    _swap_pre_post(monkeypatch)
    (outcome,) = run_experiments(["residual_depth"], Settings("quick", 0))
    assert outcome.status == "fail", outcome.error
    checks = {c.claim.split(":")[0].split(" ")[0]: c for c in outcome.result.checks}
    # Pre-LN's O(log N), which passes unbroken (tests/lab/test_exp_residual_depth.py), no
    # longer passes, and the contrast between the placements, the FAIL-type check, is what
    # FAILs. (P1, Post-LN's change outgrowing Pre-LN's, still holds: swapped, the "pre"
    # stack is Post-LN with a final norm and the "post" one Pre-LN without, whose stream
    # grows.)
    assert not checks["Pre-LN"].passed
    (contrast,) = [c for c in outcome.result.checks if c.claim.startswith("Pre-LN's output")]
    assert contrast.verdict == "FAIL"


def test_deepnorm_constants_dropped_leave_the_bounded_update_unreproduced(monkeypatch):
    # DeepNorm with alpha = beta = 1 is Post-LN: its SGD update grows with depth, so the
    # bounded-update claim (PASS unbroken: slope -0.03 at the quick size, seed 0) no longer
    # holds and is reported NOT REPRODUCED: its interval lies above the bound
    from normlab.lab.experiments import _residual_models

    monkeypatch.setattr(_residual_models, "deepnorm_constants", lambda n: (1.0, 1.0))
    (outcome,) = run_experiments(["residual_depth"], Settings("quick", 0))
    deep = outcome.result.checks[1]
    assert deep.claim.startswith("DeepNorm") and deep.verdict == "NOT REPRODUCED", deep.measured

