"""Run selected experiments one after another, catching what goes wrong in each.

Contract: [run_experiments][normlab.lab.runner.run_experiments] never raises because of an
experiment. A module that fails to import, an exception inside `run` or a result of the wrong
type becomes an `"error"` [Outcome][normlab.lab.runner.Outcome] carrying the traceback; the next
experiment still runs. An experiment with a failed criterion is a `"fail"`; one whose criteria
hold but which measures a paper's claim as not holding here is `"not reproduced"` (an honest
result); one whose measured effect is below what the run can resolve is `"inconclusive"`
(also honest, and counted apart); one whose optional dependency is missing raises
[ExperimentSkipped][normlab.lab.result.ExperimentSkipped] and is `"skipped"`.
[exit_status][normlab.lab.runner.exit_status] is 0 only when every outcome is `"pass"`, `"not
reproduced"`, `"inconclusive"` or `"skipped"`.
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
"""What happened to one experiment (see the module docstring)."""
_STATUS: dict[str, Status] = {"PASS": "pass", "FAIL": "fail", "NOT REPRODUCED": "not reproduced",
                              "INCONCLUSIVE": "inconclusive"}


@dataclass
class Outcome:
    """What happened to one experiment: its result, or the traceback that stopped it.

    Attributes
    ----------
    name : str
        The experiment's name.
    title : str
        Its title.
    status : {"pass", "fail", "not reproduced", "skipped", "error"}
        What happened.
    elapsed_s : float
        Wall time of the run, in seconds.
    result : ExperimentResult or None
        What the experiment reported (None on "error" and "skipped").
    error : str or None
        The traceback when "error"; the reason (the install line) when "skipped".
    detects : tuple of str
        The module's `DETECTS`: the breaks it is known to catch.
    """

    name: str
    title: str
    status: Status
    elapsed_s: float
    result: ExperimentResult | None = None
    error: str | None = None
    detects: tuple[str, ...] = ()


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
    """Run `names` in order with `settings`; one `Outcome` per name.

    Parameters
    ----------
    names
        Experiment names (already resolved, see [normlab.lab.experiments.resolve][]).
    settings
        Size and seed handed to every experiment.
    loader
        Maps a name to its module (tests pass fakes); default imports the registry's.
    show_progress
        Show tqdm bars (one per experiment, plus the overall line) on stderr.

    Returns
    -------
    list of Outcome
        One [Outcome][normlab.lab.runner.Outcome] per name, in order.

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
    """The exit status of a report: 0 unless an experiment FAILs or raises an exception, then 1.

    0 when every outcome is PASS, NOT REPRODUCED (an honest result), INCONCLUSIVE (an effect
    below what the run can resolve) or SKIPPED (a missing optional dependency); 1 on FAIL or
    ERROR, and for a report without any outcome.
    """
    ok = ("pass", "not reproduced", "inconclusive", "skipped")
    return 0 if outcomes and all(o.status in ok for o in outcomes) else 1
