"""What a run can resolve: the standard errors behind INCONCLUSIVE, checked independently."""

from __future__ import annotations

import math
import statistics

import numpy as np

from normlab.lab.experiments._resolution import SDE_FACTOR, bootstrap_se, miss_verdict, paired_se


def test_paired_se_is_the_sample_sd_over_root_n():
    d = [0.03, -0.01, 0.02, 0.05]
    assert paired_se(d) == statistics.stdev(d) / math.sqrt(4)  # same float formula order
    assert paired_se([0.1]) == math.inf and paired_se([]) == math.inf


def test_bootstrap_se_of_the_mean_matches_the_plug_in_formula():
    # the bootstrap distribution of a mean has sd = sd_pop(x) / sqrt(n) (population sd,
    # ddof 0); 2000 resamples estimate it to ~1.6% (relative sd 1/sqrt(2 * 2000)): 6% band
    x = np.random.default_rng(3).standard_normal((12, 1))
    se = bootstrap_se(x, lambda a: float(a.mean()), np.random.default_rng(4), draws=2000)
    np.testing.assert_allclose(se, x.std() / math.sqrt(12), rtol=0.06)
    assert bootstrap_se(x[:1], lambda a: float(a.mean()), np.random.default_rng(4)) == math.inf


def test_a_miss_is_resolved_only_beyond_the_smallest_detectable_effect():
    assert SDE_FACTOR == 2.0
    assert miss_verdict([(1.39, 1.5, 0.06)]) == "INCONCLUSIVE"  # 0.11 <= 2 * 0.06
    assert miss_verdict([(1.37, 1.5, 0.06)]) == "NOT REPRODUCED"  # 0.13 > 0.12
    assert miss_verdict([(1.0, 1.5, math.inf)]) == "INCONCLUSIVE"  # one seed
    # several failed conditions: one resolved miss is enough
    assert miss_verdict([(1.49, 1.5, 0.1), (0.2, 0.8, 0.1)]) == "NOT REPRODUCED"
