"""The benchmark's one timing helper: timings that can be trusted on a shared machine.

Every timed call of `normlab bench` goes through the sampling loop here. A sample is the
mean of `inner` back-to-back calls (then `sync()`, for devices that run asynchronously).
Two ways of using it:

- [measure][normlab.bench.timing.measure] times one call until its median is stable. It
  warms up once, picks `inner` so that a sample lasts at least `MIN_SAMPLE_S` (a call of a
  few microseconds is timed over a loop, as `timeit` does), takes samples in batches of
  `batch` and stops when the median of all samples moved by at most `rel_tol` since the
  previous batch ("stable"), or when `budget_s` is spent (then `stable` is False).
- [alternate][normlab.bench.timing.alternate] compares two calls in alternating rounds:
  each round times one sample of `a` and one of `b` back to back, in the opposite order
  from the previous round, so a busy spell of a shared machine and the order (caches,
  allocator) hit both sides alike. The robust ratio is the median over rounds of the
  round's ratio $t_a / t_b$.

Spread is the interquartile range over the median, $(q_{75} - q_{25}) / q_{50}$: a spread
above `SPREAD_WARN` means the numbers are noisy (other processes on the cores, frequency
changes) and should be read as ratios from the same run only.
[other_load][normlab.bench.timing.other_load] reads the load average against the core
count.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from normlab._backend import kernels_compiled

__all__ = ["MIN_SAMPLE_S", "SPREAD_WARN", "Alternation", "Timing", "alternate", "measure",
           "other_load", "time_into"]

MIN_SAMPLE_S = 1e-3
"""One sample of `measure` lasts at least this long, in seconds (timer resolution, jitter)."""
SPREAD_WARN = 0.10
"""Interquartile spread above which a timing is flagged as noisy."""


def _no_sync() -> None:
    return None


def _sample(fn: Callable[[], Any], inner: int, sync: Callable[[], None] = _no_sync) -> float:
    """Seconds per call: `inner` calls of `fn`, then `sync()`, divided by `inner`."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    sync()
    return (time.perf_counter() - t0) / inner


def relative_iqr(samples: Sequence[float]) -> float:
    """Interquartile range over the median of `samples` (0 for fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    median = statistics.median(samples)
    return (q3 - q1) / median if median > 0 else 0.0


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one function, from [measure][normlab.bench.timing.measure].

    Attributes
    ----------
    min_s : float
        The fastest sample (seconds per call).
    median_s : float
        The median sample (seconds per call).
    spread : float
        Interquartile range over the median of the samples.
    samples : int
        How many samples were taken.
    stable : bool
        Whether the median settled before the time budget ran out.
    """

    min_s: float
    median_s: float
    spread: float
    samples: int
    stable: bool

    def as_dict(self, prefix: str) -> dict[str, Any]:
        """The row fields `<prefix>_s` (the median), `_min_s`, `_spread`, `_samples`, `_stable`."""
        return {f"{prefix}_s": self.median_s, f"{prefix}_min_s": self.min_s,
                f"{prefix}_spread": self.spread, f"{prefix}_samples": self.samples,
                f"{prefix}_stable": self.stable}


def _inner_count(fn: Callable[[], Any]) -> int:
    """Calls per sample so that a sample lasts >= MIN_SAMPLE_S (powers of two, <= 2^16)."""
    inner = 1
    while inner < 1 << 16:
        if _sample(fn, inner) * inner >= MIN_SAMPLE_S:
            return inner
        inner *= 2
    return inner


def measure(fn: Callable[[], Any], *, budget_s: float = 3.0, batch: int = 5,
            rel_tol: float = 0.02, max_samples: int = 200) -> Timing:
    """Time `fn` until its median is stable (see the module docstring).

    Parameters
    ----------
    fn : callable
        The call to time (no arguments).
    budget_s : float, optional
        Stop after this many seconds even if the median still moves. Default 3.
    batch : int, optional
        Samples taken between two stability checks (at least 2 batches are taken).
    rel_tol : float, optional
        Largest relative change of the median between batches counted as stable.
    max_samples : int, optional
        Hard cap on the samples.

    Returns
    -------
    timing : Timing
        Median, minimum and spread of the samples.

    Examples
    --------
    >>> t = measure(lambda: sum(range(100)), budget_s=0.2)
    >>> 0 < t.min_s <= t.median_s
    True
    """
    fn()  # warm-up
    kernels_compiled()  # time the multi-threaded kernels, not the serial stand-ins
    inner = _inner_count(fn)
    samples: list[float] = []
    previous = None
    stable = False
    start = time.perf_counter()
    while len(samples) < max_samples:
        samples.extend(_sample(fn, inner) for _ in range(batch))
        median = statistics.median(samples)
        if previous is not None and abs(median - previous) <= rel_tol * median:
            stable = True
            break
        previous = median
        if len(samples) >= 2 * batch and time.perf_counter() - start > budget_s:
            break
    return Timing(min(samples), statistics.median(samples), relative_iqr(samples), len(samples),
                  stable)


def time_into(row: dict[str, Any], who: str, fn: Callable[[], Any], budget_s: float,
              slow: bool = False) -> None:
    """Time `fn` with [measure][normlab.bench.timing.measure] and store its fields in `row`.

    Parameters
    ----------
    row : dict
        A row of the benchmark's table; receives `<who>_s`, `<who>_min_s`, ...
    who : str
        The prefix of the fields ("normlab", "numpy", "torch", "ml_dtypes").
    fn : callable
        The call to time.
    budget_s : float
        Seconds per timed op.
    slow : bool, optional
        A slow reference: half the budget, batches of 3 instead of 5.
    """
    timing = measure(fn, budget_s=budget_s / 2 if slow else budget_s, batch=3 if slow else 5)
    row.update(timing.as_dict(who))


@dataclass(frozen=True)
class Alternation:
    """Two calls timed in alternating rounds, from [alternate][normlab.bench.timing.alternate].

    Attributes
    ----------
    a_s : tuple of float
        Seconds per call of `a`, one sample per round.
    b_s : tuple of float
        Seconds per call of `b`, one sample per round.
    """

    a_s: tuple[float, ...]
    b_s: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """Median over rounds of $t_a / t_b$: robust to a busy spell within a round."""
        return statistics.median(a / b for a, b in zip(self.a_s, self.b_s, strict=True))

    @property
    def ratio_of_medians(self) -> float:
        """Median time of `a` over median time of `b`."""
        return statistics.median(self.a_s) / statistics.median(self.b_s)

    @property
    def ratio_of_minima(self) -> float:
        """Fastest `a` over fastest `b` (the quietest sample of each)."""
        return min(self.a_s) / min(self.b_s)

    @property
    def ratio_spread(self) -> float:
        """Interquartile range over the median of the rounds' ratios."""
        return relative_iqr([a / b for a, b in zip(self.a_s, self.b_s, strict=True)])


def alternate(a: Callable[[], Any], b: Callable[[], Any], *, rounds: int, inner: int = 1,
              sync: Callable[[], None] = _no_sync, warmup: int = 1) -> Alternation:
    """Time `a` and `b` in `rounds` alternating rounds (see the module docstring).

    Parameters
    ----------
    a, b : callable
        The two calls (no arguments).
    rounds : int
        Rounds, each one sample of `a` and one of `b`; even rounds run `a` first, odd
        rounds `b` first.
    inner : int, optional
        Calls per sample. Default 1.
    sync : callable, optional
        Called after each sample's calls (e.g. `torch.cuda.synchronize`).
    warmup : int, optional
        Untimed calls of each before the first round (compilation, allocator, first
        touch, the first step of a stateful recipe). Default 1.

    Returns
    -------
    alternation : Alternation
        The samples of both; ratios as properties.

    Examples
    --------
    >>> t = alternate(lambda: sum(range(2000)), lambda: sum(range(1000)), rounds=5, inner=50)
    >>> len(t.a_s), t.ratio > 0
    (5, True)
    """
    for _ in range(warmup):
        for f in (a, b):
            f()
        sync()
    kernels_compiled()  # time the multi-threaded kernels, not the serial stand-ins
    a_s: list[float] = []
    b_s: list[float] = []
    for k in range(max(1, rounds)):
        order = ((a, a_s), (b, b_s)) if k % 2 == 0 else ((b, b_s), (a, a_s))
        for f, out in order:
            out.append(_sample(f, inner, sync))
    return Alternation(tuple(a_s), tuple(b_s))


def other_load() -> tuple[float, int] | None:
    """The 1-minute load average and the core count, or None without a load average.

    Returns
    -------
    load : tuple of (float, int) or None
        (load average, cores).
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return load, os.cpu_count() or 1
