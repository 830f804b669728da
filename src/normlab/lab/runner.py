"""Run selected experiments one after another, catching what goes wrong in each.

Contract: :func:`run_experiments` never raises because of an experiment. A module that
fails to import, an exception inside ``run`` or a result of the wrong type becomes an
``"error"`` :class:`Outcome` carrying the traceback; the next experiment still runs. An
experiment with a failed criterion is a ``"fail"``; one whose criteria hold but which
measures a paper's claim as not holding here is ``"not reproduced"`` (an honest result); one
whose measured effect is below what the run can resolve is ``"inconclusive"`` (also honest,
and counted apart); one whose optional dependency is missing raises :class:`ExperimentSkipped`
and is ``"skipped"``. :func:`exit_status` is 0 only when every outcome is ``"pass"``,
``"not reproduced"``, ``"inconclusive"`` or ``"skipped"``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from normlab.lab.experiments import EXPERIMENTS, load
from normlab.lab.result import (
    ExperimentResult,
    ExperimentSkipped,
    NullProgress,
    Progress,
    Settings,
)

__all__ = ["Outcome", "exit_status", "run_experiments"]

Status = Literal["pass", "fail", "not reproduced", "inconclusive", "skipped", "error"]
_STATUS: dict[str, Status] = {"PASS": "pass", "FAIL": "fail", "NOT REPRODUCED": "not reproduced",
                              "INCONCLUSIVE": "inconclusive"}


@dataclass
class Outcome:
    """What happened to one experiment: its result, or the traceback that stopped it."""

    name: str
    title: str
    status: Status
    elapsed_s: float
    result: ExperimentResult | None = None
    error: str | None = None  # traceback when "error"; the reason (install line) when "skipped"
    detects: tuple[str, ...] = ()  # the module's DETECTS: breaks it is known to catch


def _run_one(
    name: str, settings: Settings, progress: Progress, loader: Callable[[str], Any]
) -> Outcome:
    title = EXPERIMENTS.get(name, name)
    start = time.perf_counter()
    detects: tuple[str, ...] = ()
    try:
        module = loader(name)
        title = getattr(module, "TITLE", title)
        detects = tuple(str(d) for d in getattr(module, "DETECTS", ()))
        result = module.run(settings, progress)
        if not isinstance(result, ExperimentResult):
            raise TypeError(
                f"experiment {name!r} returned {type(result).__name__}, not ExperimentResult"
            )
    except ExperimentSkipped as exc:  # an optional dependency is missing: not a failure
        return Outcome(name, title, "skipped", time.perf_counter() - start, error=str(exc),
                       detects=detects)
    except Exception:  # the report shows the traceback; the other experiments still run
        return Outcome(
            name, title, "error", time.perf_counter() - start, error=traceback.format_exc(),
            detects=detects,
        )
    elapsed = time.perf_counter() - start
    status = _STATUS[result.verdict]
    return Outcome(name, result.title or title, status, elapsed, result=result, detects=detects)


def run_experiments(
    names: Sequence[str],
    settings: Settings,
    *,
    loader: Callable[[str], Any] = load,
    show_progress: bool = False,
) -> list[Outcome]:
    """Run ``names`` in order with ``settings``; one :class:`Outcome` per name.

    Parameters
    ----------
    names : experiment names (already resolved, see :func:`normlab.lab.experiments.resolve`).
    settings : size and seed handed to every experiment.
    loader : maps a name to its module (tests pass fakes); default imports the registry's.
    show_progress : show tqdm bars (one per experiment, plus the overall line) on stderr.

    Notes
    -----
    An experiment without any check counts as a failure: a report must measure something.
    """
    if show_progress:
        from normlab.lab.progress import OverallProgress, TqdmProgress

        overall: OverallProgress | None = OverallProgress(len(names))
        bar: TqdmProgress | None = TqdmProgress()
    else:
        overall, bar = None, None
    progress: Progress = bar if bar is not None else NullProgress()
    outcomes = []
    try:
        for name in names:
            if overall is not None:
                overall.begin(name)
            outcomes.append(_run_one(name, settings, progress, loader))
            if bar is not None:
                bar.close()
            if overall is not None:
                overall.done()
    finally:
        if bar is not None:
            bar.close()
        if overall is not None:
            overall.close()
    return outcomes


def exit_status(outcomes: Sequence[Outcome]) -> int:
    """0 when every experiment passed (or honestly did not reproduce a claim, or could not
    resolve one, or was skipped for a missing optional dependency), else 1."""
    ok = ("pass", "not reproduced", "inconclusive", "skipped")
    return 0 if outcomes and all(o.status in ok for o in outcomes) else 1
