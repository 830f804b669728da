"""Experiment 6 (batch_vs_layer): checks pass, key numbers recomputed with plain NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from normlab._backend import use_backend
from normlab.lab.experiments import batch_vs_layer as exp


@pytest.fixture(autouse=True)
def _reference_backend():
    # many calls on tiny arrays: the NumPy references are the fast path here
    with use_backend("numpy"):
        yield


def test_quick_run_passes_every_check(quick_results):
    result = quick_results[exp.NAME]
    assert result.passed and len(result.checks) == 5
    gaps = result.metrics["train_eval_gap"]
    assert list(gaps) == [str(b) for b in exp.BATCH_SIZES]
    assert set(result.figures) == {"outputs", "ioffe_fig1"}


def test_figure1_percentiles_and_drift_recomputed(quick_results):
    # the MLP's recorded percentiles are ordered, and the drift criterion recomputed by hand:
    # max over checkpoints t >= 1 of |median_t - median_1| / (p85_t - p15_t)
    mlp = quick_results[exp.NAME].metrics["mlp"]
    for key in ("plain", "bn"):
        p = np.array(mlp[key]["percentiles"])
        assert np.all(p[:, 0] <= p[:, 1]) and np.all(p[:, 1] <= p[:, 2])
        by_hand = max(abs(p[t, 1] - p[1, 1]) / (p[t, 2] - p[t, 0]) for t in range(1, len(p)))
        assert exp.median_drift(p) == pytest.approx(by_hand, rel=1e-12)
    # with BatchNorm the unit's input is a normalised value: its median near 0 at step 0
    assert abs(mlp["bn"]["percentiles"][0][1]) < 0.2


def test_composition_numbers_match_a_direct_computation():
    comp = exp.composition_changes(4)
    # LayerNorm of a row never sees the other rows: exactly zero change in float64
    assert comp["ln_in_batches"] == 0.0 and comp["ln_decode"] == 0.0
    # BatchNorm of one example inside two different batches, by the textbook formula:
    # a change of tens of percent is expected (batch means/variances of 3-9 sequences)
    assert comp["bn_in_batches"] > 0.05
    assert comp["bn_single_position_ok"] == 0.0


def _listing_gap(rng, batch, steps, probes, mu, sigma):
    # the chapter's Listing 16.3 (momentum 0.9 of the old statistic, biased variance)
    # written out with NumPy, no library code
    rm, rv = np.zeros(16), np.ones(16)
    for _ in range(steps):
        x = mu + sigma * rng.standard_normal((batch, 16))
        rm = 0.9 * rm + 0.1 * x.mean(0)
        rv = 0.9 * rv + 0.1 * x.var(0)
    gaps = []
    for _ in range(probes):
        x = mu + sigma * rng.standard_normal((batch, 16))
        train = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
        ev = (x - rm) / np.sqrt(rv + 1e-5)
        gaps.append(np.mean(np.abs(train - ev)))
    return float(np.mean(gaps))


def test_train_eval_gap_agrees_with_a_plain_numpy_simulation():
    # Same protocol, independent code and random streams, averaged over 6 seeds each. The
    # final running statistics are a random draw per seed (momentum 0.9 keeps ~10 batches),
    # so single runs differ by ~10-20% at batch 2; averaged over 6 seeds a 15% relative
    # tolerance is about 3 standard errors.
    rng = np.random.default_rng(123)
    for batch in (2, 32):
        mine = np.mean(
            [
                _listing_gap(rng, batch, 200, 100, rng.normal(0, 2, 16), rng.uniform(0.5, 3, 16))
                for _ in range(6)
            ]
        )
        theirs = np.mean([exp.train_eval_gap(s, batch, 200, 100) for s in range(6)])
        np.testing.assert_allclose(theirs, mine, rtol=0.15)
