r"""What a run can resolve: standard errors over seeds and the INCONCLUSIVE verdict.

A claim that misses its criterion is NOT REPRODUCED only when the miss is larger than what
the seeds can resolve; below that it is INCONCLUSIVE, and the check states the smallest
detectable effect. Throughout, the smallest detectable effect is
$\mathrm{SDE} = 2\,\mathrm{se}$ (SDE_FACTOR standard errors, about a 95% two-sided
interval), with the standard error computed from the seeds:

* paired differences $d_i$ over $n$ seeds: $\mathrm{se} = s_d / \sqrt n$ (sample standard
  deviation, $n - 1$ degrees of freedom); one seed resolves nothing ($\mathrm{se} = \infty$);
* any other statistic of per-seed measurements: the bootstrap standard error over seeds
  (resampling the seeds with replacement, a generator passed in).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from normlab.lab.result import Verdict

__all__ = ["SDE_FACTOR", "bootstrap_se", "miss_verdict", "paired_se"]

SDE_FACTOR = 2.0
"""Standard errors in the smallest detectable effect."""


def paired_se(diffs: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean of paired differences; inf for fewer than two.

    >>> paired_se([1.0, 3.0])
    1.0
    >>> paired_se([0.5])
    inf
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return math.inf
    return float(np.std(d, ddof=1) / math.sqrt(d.size))


def bootstrap_se(per_seed: np.ndarray, statistic: Callable[[np.ndarray], float],
                 rng: np.random.Generator, draws: int = 200) -> float:
    """Bootstrap standard error of `statistic(per_seed)` over the seeds (axis 0).

    Parameters
    ----------
    per_seed : numpy.ndarray
        Shape (S, ...): one measurement per seed.
    statistic : callable
        Maps an array of that shape (seeds resampled) to a float.
    rng : numpy.random.Generator
        Draws the resamples.
    draws : int, optional
        Number of resamples. Default 200.

    Returns
    -------
    se : float
        Standard deviation of the statistic over the resamples; inf for one seed.
    """
    s = per_seed.shape[0]
    if s < 2:
        return math.inf
    values = [statistic(per_seed[rng.integers(0, s, size=s)]) for _ in range(draws)]
    return float(np.std(values, ddof=1))


def miss_verdict(misses: Sequence[tuple[float, float, float]]) -> Verdict:
    """NOT REPRODUCED if any failed condition misses its threshold by more than SDE, else
    INCONCLUSIVE.

    `misses` holds (value, threshold, se) for every condition of the criterion that failed.

    >>> miss_verdict([(1.4, 1.5, 0.1)]), miss_verdict([(1.0, 1.5, 0.1)])
    ('INCONCLUSIVE', 'NOT REPRODUCED')
    """
    resolved = any(abs(v - t) > SDE_FACTOR * se for v, t, se in misses)
    return "NOT REPRODUCED" if resolved else "INCONCLUSIVE"
