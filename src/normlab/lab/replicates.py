r"""Verdicts from replicates: one effect, its interval, and the verdict the interval allows.

The one place where the lab turns measurements into PASS, NOT REPRODUCED or INCONCLUSIVE
(every experiment with a statistical claim calls [decide][normlab.lab.replicates.decide]):

* a claim is measured over n independent replicates, each with its own generator
  ([replicate_seeds][normlab.lab.replicates.replicate_seeds]: `numpy.random.SeedSequence`
  children of the report's `--seed`, so replicates never share a stream);
* one number per replicate (the effect: a loss difference, a slope, a time ratio) gives an
  [Interval][normlab.lab.replicates.Interval] for the effect;
* the criterion is a threshold (or a band) on the effect: PASS when the whole interval
  clears it, NOT REPRODUCED when the whole interval lies on the other side, INCONCLUSIVE
  when the interval straddles it. The smallest detectable effect of the run is the
  interval's half-width: an effect that far from the criterion would have been decided.

Interval methods, and why:

* `"t"` (the default): the Student t interval of the mean over replicates,
  $\bar d \pm t_{0.975, n-1}\, s / \sqrt n$. The replicates are independent by construction
  and each is itself an average (a final loss over many tokens, a slope over depths), close
  to normal; at the lab's n of 3 to 8 the t interval keeps its coverage where a percentile
  bootstrap does not (with n = 4 a bootstrap draws only 35 distinct resamples and its
  interval is about as narrow as a normal one with the sample sd, too narrow by the t/z
  factor 3.18/1.96).
* `"median"`: the distribution-free interval of the median from order statistics, for
  timings. A burst of machine load lands on one repeat and makes it an outlier; the mean
  and its t interval follow the outlier, the median interval only widens.

One replicate resolves nothing: its interval is infinite and the verdict INCONCLUSIVE.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from normlab.lab.result import Check, Verdict

__all__ = [
    "LEVEL",
    "Criterion",
    "Interval",
    "decide",
    "judged",
    "median_interval",
    "replicate_seeds",
    "t_interval",
    "t_quantile",
]

LEVEL = 0.95
"""Two-sided coverage of every interval the lab reports."""

Method = Literal["t", "median"]
"""How an interval was made (see the module docstring)."""


def replicate_seeds(seed: int, n: int, stream: int = 0) -> list[np.random.SeedSequence]:
    """`n` independent seed sequences for the replicates of one claim of report seed `seed`.

    `stream` separates the claims of one experiment (each uses its own number). A
    replicate's generator is `numpy.random.default_rng(seq)`; `seq.spawn(k)` gives it
    more independent streams (weights, batches).

    Examples
    --------
    >>> a = replicate_seeds(0, 3)
    >>> [int(s.generate_state(1)[0]) == int(t.generate_state(1)[0]) for s, t in zip(a, a)]
    [True, True, True]
    >>> len(replicate_seeds(0, 3, stream=1))
    3
    """
    if n < 1:
        raise ValueError(f"replicate_seeds: n must be at least 1, got {n!r}")
    return np.random.SeedSequence([seed, stream]).spawn(n)


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom (closed form, integer df)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2.4/(3.5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + s * math.cos(theta) * total) if df > 1 \
            else 2.0 / math.pi * theta
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile (p > 0.5) of Student's t with `df` degrees of freedom.

    Solved by bisection on the closed-form distribution function (to 1e-12).

    Examples
    --------
    >>> round(t_quantile(0.975, 4), 3)
    2.776
    """
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile: need 0.5 < p < 1 and df >= 1, got p={p!r}, df={df!r}")
    want, lo, hi = 2.0 * p - 1.0, 0.0, 1.0
    while _t_two_sided(hi, df) < want:
        hi *= 2.0
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_two_sided(mid, df) < want else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """An effect measured over replicates, with its 95% interval.

    Attributes
    ----------
    estimate : float
        The effect: the mean (method "t") or the median (method "median") over replicates.
    low : float
        The interval's lower end (-inf for a single replicate).
    high : float
        The interval's upper end (inf for a single replicate).
    n : int
        Number of replicates.
    method : {"t", "median"}
        How the interval was made (the module docstring says why each).
    averaged : str
        What one replicate's number is, e.g. "final loss difference of one seed pair".
    values : tuple of float
        The replicates' numbers.
    """

    estimate: float
    low: float
    high: float
    n: int
    method: Method
    averaged: str
    values: tuple[float, ...] = ()

    @property
    def half_width(self) -> float:
        """The larger distance from the estimate to an end: the smallest detectable effect."""
        return max(self.estimate - self.low, self.high - self.estimate)

    def text(self, fmt: str = ".3g") -> str:
        """`"0.42 [0.31, 0.53], n = 5"`."""
        return (f"{self.estimate:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}], "
                f"n = {self.n}")


def t_interval(values: Sequence[float] | np.ndarray, averaged: str) -> Interval:
    """The t interval (95%) of the mean of `values`, one per replicate.

    Examples
    --------
    >>> iv = t_interval([1.0, 2.0, 3.0], "x")
    >>> round(iv.estimate, 6), round(iv.high - iv.estimate, 3)
    (2.0, 2.484)
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"t_interval: values must be finite and not empty, got {v.tolist()!r}")
    mean = float(v.mean())
    if v.size < 2:
        return Interval(mean, -math.inf, math.inf, 1, "t", averaged, (mean,))
    half = t_quantile(0.5 + LEVEL / 2, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return Interval(mean, mean - half, mean + half, int(v.size), "t", averaged,
                    tuple(float(x) for x in v))


def _binom_cdf(n: int, k: int) -> float:
    """P(K <= k) for K ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n


def median_interval(values: Sequence[float] | np.ndarray, averaged: str) -> Interval:
    """The distribution-free interval [v_(j), v_(n+1-j)] of the median, coverage >= 95%.

    j is the largest rank with P(K < j) <= 2.5% for K ~ Binomial(n, 1/2); below n = 6 no
    rank gives 95% and the interval is infinite.

    Examples
    --------
    >>> iv = median_interval([float(i) for i in range(1, 12)], "x")
    >>> iv.estimate, iv.low, iv.high
    (6.0, 2.0, 10.0)
    """
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"median_interval: values must be finite and not empty, got "
                         f"{v.tolist()!r}")
    n, tail = int(v.size), (1.0 - LEVEL) / 2
    j = 0
    while j + 1 <= n // 2 and _binom_cdf(n, j) <= tail:  # P(K < j + 1) = P(K <= j)
        j += 1
    low, high = (float(v[j - 1]), float(v[n - j])) if j else (-math.inf, math.inf)
    return Interval(float(np.median(v)), low, high, n, "median", averaged,
                    tuple(float(x) for x in v))


@dataclass(frozen=True)
class Criterion:
    """What the effect must be for the claim to hold: `>= low`, `<= high`, or both (a band).

    Attributes
    ----------
    low : float or None
        The effect must be at least this (None: no lower limit).
    high : float or None
        The effect must be at most this (None: no upper limit).
    """

    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.low is None and self.high is None:
            raise ValueError("Criterion: give low, high or both, got neither")

    def text(self, name: str = "effect") -> str:
        """`"effect >= 0.1"`, `"effect <= 2"` or `"effect in [0.75, 1.25]"`."""
        if self.low is not None and self.high is not None:
            return f"{name} in [{self.low:g}, {self.high:g}]"
        return f"{name} >= {self.low:g}" if self.low is not None else f"{name} <= {self.high:g}"


def decide(interval: Interval, criterion: Criterion) -> tuple[Verdict, float]:
    """The verdict the interval allows, and the smallest detectable effect.

    PASS when the whole interval satisfies the criterion, NOT REPRODUCED when the whole
    interval violates it (lies beyond one of its limits), INCONCLUSIVE otherwise.

    Returns
    -------
    verdict : {"PASS", "NOT REPRODUCED", "INCONCLUSIVE"}
        What the interval allows (see above).
    smallest_detectable : float
        The interval's half-width: how far from a limit the effect must lie for a run of
        this size to decide.

    Examples
    --------
    >>> from normlab.lab.replicates import Interval as I
    >>> decide(I(1.0, 0.8, 1.2, 5, "t", ""), Criterion(low=0.5))[0]
    'PASS'
    >>> decide(I(1.0, 0.8, 1.2, 5, "t", ""), Criterion(low=0.9))[0]
    'INCONCLUSIVE'
    >>> decide(I(1.0, 0.8, 1.2, 5, "t", ""), Criterion(high=0.5))[0]
    'NOT REPRODUCED'
    """
    lo = -math.inf if criterion.low is None else criterion.low
    hi = math.inf if criterion.high is None else criterion.high
    if lo <= interval.low and interval.high <= hi:
        verdict: Verdict = "PASS"
    elif interval.high < lo or interval.low > hi:
        verdict = "NOT REPRODUCED"
    else:
        verdict = "INCONCLUSIVE"
    return verdict, interval.half_width


_METHOD_TEXT = {"t": "t interval of the mean", "median": "order-statistic interval of the median"}


def judged(source: str, claim: str, criterion: Criterion, interval: Interval, *, name: str,
           measured: str = "", values: dict | None = None, fmt: str = ".3g",
           decides: bool = True) -> Check:
    """A [Check][normlab.lab.result.Check] decided by [decide][normlab.lab.replicates.decide].

    Parameters
    ----------
    source : str
        The paper, as in [Check][normlab.lab.result.Check].
    claim : str
        The paper's claim, in words.
    criterion : Criterion
        The limits on the effect.
    interval : Interval
        The effect over the replicates.
    name : str
        The effect's name in the criterion and the measured text (`"slope"`).
    measured : str, optional
        More of what was measured, after the interval.
    values : dict, optional
        More raw numbers for `metrics.json` (the interval and the verdict's numbers are
        added).
    fmt : str, optional
        Format of the interval's numbers. Default `".3g"`.
    decides : bool, optional
        False where the run's size has too few replicates to decide this claim the same way
        at every seed (measured over seeds 0-9): the interval is reported and the verdict
        is INCONCLUSIVE, saying so. Default True.

    Returns
    -------
    Check
        `passed` when the verdict is PASS; `if_false` the verdict otherwise.
    """
    verdict, sde = decide(interval, criterion)
    if not decides:
        verdict = "INCONCLUSIVE"
    rule = (f"{criterion.text(name)}, decided on the 95% {_METHOD_TEXT[interval.method]} "
            f"over {interval.n} replicates: PASS when the interval clears it, NOT REPRODUCED "
            "when it excludes it, INCONCLUSIVE otherwise")
    shown = f"{name} {interval.text(fmt)}"
    if verdict == "INCONCLUSIVE":
        shown += f"; smallest detectable effect {sde:{fmt}}"
    if not decides:
        shown += ("; not decided at this size: too few replicates for the same verdict at "
                  "every seed (a larger size, with more replicates, decides)")
    if measured:
        shown += f"; {measured}"
    numbers = {**(values or {}), "effect": interval.estimate, "interval": [interval.low,
               interval.high], "replicates": interval.n, "smallest_detectable": sde,
               "decided": decides}
    return Check(source, claim, rule, shown, verdict == "PASS", numbers,
                 if_false="INCONCLUSIVE" if verdict == "PASS" else verdict, interval=interval)
