"""The shared verdict rule: intervals over replicates, checked against independent sources."""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab.lab.replicates import (
    Criterion,
    Interval,
    decide,
    judged,
    median_interval,
    replicate_seeds,
    t_interval,
    t_quantile,
)

# t(0.975, df) from a printed table of Student's t (5 significant digits)
_TABLE = {1: 12.706, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 7: 2.3646, 9: 2.2622,
          30: 2.0423}


@pytest.mark.parametrize("df", sorted(_TABLE))
def test_t_quantile_matches_the_printed_table(df):
    # the table rounds to 5 significant digits: relative 5e-5
    assert t_quantile(0.975, df) == pytest.approx(_TABLE[df], rel=5e-5)


@pytest.mark.parametrize("df", [1, 2, 3, 6, 11])
def test_t_quantile_by_integrating_the_density(df):
    # an independent route: the t density integrated numerically from -q to q must give
    # 0.95 (trapezoid on a fine grid after the substitution x = tan(u): error ~1e-8)
    q = t_quantile(0.975, df)
    u = np.linspace(-math.atan(q), math.atan(q), 200001)
    x = np.tan(u)
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    dens = c * (1 + x**2 / df) ** (-(df + 1) / 2) / np.cos(u) ** 2
    mass = float(np.sum((dens[1:] + dens[:-1]) / 2 * np.diff(u)))
    assert mass == pytest.approx(0.95, abs=1e-7)


def test_t_interval_covers_the_mean_95_percent_of_the_time():
    # 4000 normal samples of n = 4: coverage 0.95 +- 3 binomial sd (0.0103)
    rng = np.random.default_rng(11)
    samples = rng.normal(2.0, 3.0, (4000, 4))
    hits = 0
    for row in samples:
        iv = t_interval(row, "x")
        hits += iv.low <= 2.0 <= iv.high
    assert abs(hits / 4000 - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / 4000)


def test_t_interval_is_the_textbook_formula_and_one_replicate_resolves_nothing():
    v = [0.3, 0.1, 0.5, 0.2]
    iv = t_interval(v, "gap of one seed")
    half = _TABLE[3] * np.std(v, ddof=1) / 2
    assert iv.estimate == pytest.approx(0.275) and iv.n == 4 and iv.method == "t"
    assert iv.high - iv.estimate == pytest.approx(half, rel=5e-5)
    one = t_interval([0.4], "x")
    assert one.n == 1 and math.isinf(one.low) and math.isinf(one.high)
    assert decide(one, Criterion(low=0.0))[0] == "INCONCLUSIVE"
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, math.inf], "x")


def test_median_interval_coverage_by_enumeration():
    # [v_(j), v_(n+1-j)] misses the median when fewer than j values lie below it (or
    # above): coverage 1 - 2 P(K < j), K ~ Binomial(n, 1/2), counted over all 2^n sign
    # patterns; the rank chosen is the largest with coverage >= 95%
    import itertools

    for n in (6, 11, 15, 21):
        counts = np.zeros(n + 1)
        for bits in itertools.product((0, 1), repeat=n):
            counts[sum(bits)] += 1
        iv = median_interval([float(i) for i in range(1, n + 1)], "x")
        j = int(iv.low)
        below = counts[:j].sum() / 2**n  # P(K < j)
        assert 1 - 2 * below >= 0.95
        assert 1 - 2 * counts[: j + 1].sum() / 2**n < 0.95  # j + 1 would not cover
        assert iv.high == n + 1 - j
    assert math.isinf(median_interval([1.0, 2.0, 3.0, 4.0, 5.0], "x").low)  # n = 5: none


@pytest.mark.parametrize(("low", "high", "crit", "want"), [
    (0.2, 0.4, Criterion(low=0.1), "PASS"),
    (0.05, 0.4, Criterion(low=0.1), "INCONCLUSIVE"),
    (-0.3, 0.05, Criterion(low=0.1), "NOT REPRODUCED"),
    (0.2, 0.4, Criterion(high=0.1), "NOT REPRODUCED"),
    (-0.05, 0.05, Criterion(low=-0.1, high=0.1), "PASS"),
    (-0.05, 0.15, Criterion(low=-0.1, high=0.1), "INCONCLUSIVE"),
    (0.12, 0.15, Criterion(low=-0.1, high=0.1), "NOT REPRODUCED"),
])
def test_decide_compares_the_whole_interval_with_the_criterion(low, high, crit, want):
    iv = Interval((low + high) / 2, low, high, 5, "t", "x")
    verdict, sde = decide(iv, crit)
    assert verdict == want and sde == pytest.approx((high - low) / 2)


def test_judged_check_carries_the_interval_and_the_smallest_detectable_effect():
    c = judged("paper", "x grows", Criterion(low=0.0), t_interval([0.1, -0.1, 0.2], "slope"),
               name="slope")
    assert c.verdict == "INCONCLUSIVE" and c.interval is not None
    assert "smallest detectable effect" in c.measured
    assert c.values["replicates"] == 3 and c.values["interval"][0] < 0 < c.values["interval"][1]
    assert judged("p", "c", Criterion(low=0.0), t_interval([1.0, 1.1, 0.9], "s"),
                  name="s").verdict == "PASS"


def test_replicate_seeds_are_distinct_and_reproducible():
    a = [int(q.generate_state(1)[0]) for q in replicate_seeds(3, 5)]
    b = [int(q.generate_state(1)[0]) for q in replicate_seeds(3, 5)]
    c = [int(q.generate_state(1)[0]) for q in replicate_seeds(4, 5)]
    d = [int(q.generate_state(1)[0]) for q in replicate_seeds(3, 5, stream=1)]
    assert a == b and len(set(a)) == 5 and not set(a) & set(c) and not set(a) & set(d)
    with pytest.raises(ValueError, match="n must be at least 1"):
        replicate_seeds(0, 0)


def test_a_size_that_does_not_decide_reports_inconclusive_with_its_interval():
    iv = t_interval([1.0, 1.1, 0.9], "s")
    c = judged("p", "c", Criterion(low=0.0), iv, name="s", decides=False)
    assert c.verdict == "INCONCLUSIVE" and c.interval is iv and c.values["decided"] is False
    assert "not decided at this size" in c.measured
