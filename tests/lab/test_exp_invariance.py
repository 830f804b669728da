"""Experiment 5 (invariance): the table of Ba et al. 2016 (+ RMSNorm), recomputed independently."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.lab.experiments import invariance as exp
from normlab.lab.result import NullProgress, Settings

# The papers' tables typed in again here (Ba et al. 2016 Table 1; Zhang & Sennrich 2019
# Table 1), columns: weight matrix re-scaling, weight matrix re-centering, weight vector
# re-scaling, dataset re-scaling, dataset re-centering, single training case re-scaling.
PAPERS = {
    "BatchNorm": "Y N Y Y Y N",
    "WeightNorm": "Y N Y N N N",
    "LayerNorm": "Y Y N Y N Y",
    "RMSNorm": "Y N N Y N Y",
}


def test_quick_run_passes_and_prints_the_papers_table():
    result = exp.run(Settings("quick", 0), NullProgress())
    assert result.passed and len(result.checks) == 4
    table = result.tables[0].splitlines()
    for line, (method, row) in zip(table[2:], PAPERS.items(), strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == method
        assert cells[1:] == ["Invariant" if v == "Y" else "No" for v in row.split()]


# Direct one-line norms (no library code, no eps): what the papers' table is about.
def _bn(a):
    return (a - a.mean(0)) / a.std(0)


def _wn(a, w):
    return a / np.linalg.norm(w, axis=1)


def _ln(a):
    return (a - a.mean(1, keepdims=True)) / a.std(1, keepdims=True)


def _rms(a):
    return a / np.sqrt(np.mean(a * a, axis=1, keepdims=True))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_independent_recomputation_agrees_cell_by_cell(seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((10, 7)) + 1.0, rng.standard_normal((5, 7))  # N,I ; H,I
    row = np.ones((5, 1))
    row[2] = 4.0
    case = np.ones((10, 1))
    case[3] = 0.3
    transforms = [
        (x, 2.5 * w),
        (x, w + rng.standard_normal(7)),
        (x, row * w),
        (2.5 * x, w),
        (x + rng.standard_normal(7), w),
        (case * x, w),
    ]
    layers = {
        "BatchNorm": lambda x, w: _bn(x @ w.T),
        "WeightNorm": lambda x, w: _wn(x @ w.T, w),
        "LayerNorm": lambda x, w: _ln(x @ w.T),
        "RMSNorm": lambda x, w: _rms(x @ w.T),
    }
    measured = exp.invariance_matrix(seed)
    for r, method in enumerate(exp.METHODS):
        base = layers[method](x, w)
        # invariant: equal to float64 rounding (1e-12 relative); otherwise clearly changed
        mine = [np.max(np.abs(layers[method](*t) - base)) <= 1e-12 * np.max(np.abs(base))
                for t in transforms]  # fmt: skip
        theirs = [v <= exp.INVARIANT_TOL for v in measured[r]]
        assert mine == theirs == [v == "Y" for v in PAPERS[method].split()], method
        assert all(v <= exp.INVARIANT_TOL or v > exp.CHANGED_TOL for v in measured[r])


def test_a_wrong_norm_is_caught(monkeypatch):
    # LayerNorm without its mean subtraction loses re-centering invariance: the LN row fails
    def no_centering(a, gamma, beta, eps=1e-5):
        return exp.rms_norm_forward(a, gamma, eps=eps)[0] + beta, None

    monkeypatch.setattr(exp, "layer_norm_forward", no_centering)
    result = exp.run(Settings("quick", 0), NullProgress())
    verdicts = {c.claim.split(":")[0]: c.passed for c in result.checks}
    assert verdicts == {"BatchNorm": True, "WeightNorm": True, "LayerNorm": False, "RMSNorm": True}
