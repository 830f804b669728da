"""Timing that can be trusted on a shared machine: repeat until the median is stable.

Contract: :func:`measure` calls ``fn`` once to warm up (compilation, cache load, first
touch of buffers), then takes samples, each the mean of ``inner`` back-to-back calls with
``inner`` chosen so that one sample lasts at least ``MIN_SAMPLE_S`` (a call of a few
microseconds is timed over a loop, as ``timeit`` does). Samples come in batches of
``batch``; it stops when the median of all samples moved by at most ``rel_tol`` since the
previous batch ("stable"), or when ``budget_s`` is spent (then ``stable`` is False). It
reports the minimum, the median and the spread, the interquartile range over the median
``(q75 - q25) / median``: a spread above ``SPREAD_WARN`` means the numbers are noisy
(other processes on the cores, frequency changes) and should be read as ratios from the
same run only. :func:`other_load` reads the load average against the core count.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_SAMPLE_S", "SPREAD_WARN", "Timing", "measure", "other_load"]

MIN_SAMPLE_S = 1e-3  # one sample lasts at least this long (timer resolution, call jitter)
SPREAD_WARN = 0.10  # interquartile spread above which a timing is flagged as noisy


@dataclass(frozen=True)
class Timing:
    """Seconds per call: ``min_s``, ``median_s``; ``spread`` = IQR / median; sample count."""

    min_s: float
    median_s: float
    spread: float
    samples: int
    stable: bool

    def as_dict(self, prefix: str) -> dict[str, Any]:
        """The row fields ``<prefix>_s`` (the median), ``_min_s``, ``_spread``, ``_samples``."""
        return {f"{prefix}_s": self.median_s, f"{prefix}_min_s": self.min_s,
                f"{prefix}_spread": self.spread, f"{prefix}_samples": self.samples,
                f"{prefix}_stable": self.stable}


def _sample(fn: Callable[[], Any], inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


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
    """Time ``fn`` until its median is stable (see the module contract).

    Parameters
    ----------
    fn : the call to time (no arguments).
    budget_s : stop after this many seconds even if the median still moves.
    batch : samples taken between two stability checks (at least 2 batches are taken).
    rel_tol : largest relative change of the median between batches counted as stable.
    max_samples : hard cap on the samples.

    Returns
    -------
    Timing

    Example
    -------
    >>> t = measure(lambda: sum(range(100)), budget_s=0.2)
    >>> 0 < t.min_s <= t.median_s
    True
    """
    fn()  # warm-up
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
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (0, 0, 0)
    median = statistics.median(samples)
    return Timing(min(samples), median, (q3 - q1) / median if median > 0 else 0.0,
                  len(samples), stable)


def other_load() -> tuple[float, int] | None:
    """(1-minute load average, cores) or None where the OS has no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return load, os.cpu_count() or 1
