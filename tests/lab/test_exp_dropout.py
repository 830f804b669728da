"""Experiment 7 (dropout_stats): checks pass, and its key numbers recomputed independently."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.lab.experiments import dropout_stats as exp
from normlab.lab.result import NullProgress, Settings


def test_quick_run_passes_every_check():
    result = exp.run(Settings("quick", 0), NullProgress())
    assert result.passed and len(result.checks) == 3
    assert set(result.figures) == {"moments"}


@settings(max_examples=50, deadline=None)
@given(
    x=st.floats(-1e3, 1e3).filter(lambda v: abs(v) > 1e-3),
    p=st.floats(0.01, 0.99),
)
def test_exact_moments_match_the_two_point_law(x, p):
    # enumerate the two outcomes of out = m x/(1-p), m ~ Bernoulli(1-p), independently of
    # the experiment's closed forms; rtol 1e-9: a handful of float64 operations on each side
    values, probs = np.array([0.0, x / (1 - p)]), np.array([p, 1 - p])
    mean = np.sum(probs * values)
    var = np.sum(probs * (values - mean) ** 2)
    mu4 = np.sum(probs * (values - mean) ** 4)
    got_var, got_mu4 = exp.exact_moments(np.array([x]), p)
    np.testing.assert_allclose(mean, x, rtol=1e-12)
    np.testing.assert_allclose(got_var[0], var, rtol=1e-9)
    np.testing.assert_allclose(got_mu4[0], mu4, rtol=1e-9)


def test_sample_moments_are_those_of_the_listing_with_the_same_seed():
    # the chapter's Listing 16.3 written out here: same draws -> same sample statistics
    # (rtol 1e-12: identical arithmetic up to summation order)
    x = np.array([0.5, -2.0, 30.0])
    p, n = 0.3, 5000
    stats = exp.dropout_moments(x, p, n, np.random.default_rng(11))
    keep = np.random.default_rng(11).random((n, 3)) >= p
    out = np.broadcast_to(x, (n, 3)) * keep / (1 - p)
    np.testing.assert_allclose(stats["mean"], out.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["var"], np.mean((out - x) ** 2, axis=0), rtol=1e-12)


def test_a_dropout_without_the_rescaling_fails_the_mean_check(monkeypatch):
    def unscaled(x, p, rng):  # forgets the 1/(1-p): E[out] = (1-p) x
        keep = rng.random(x.shape) >= p
        return x * keep, keep

    monkeypatch.setattr(exp, "inverted_dropout", unscaled)
    result = exp.run(Settings("quick", 0), NullProgress())
    assert not result.checks[0].passed and not result.passed
