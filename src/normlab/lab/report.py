"""Write a lab run to a folder: report.md, report.html, figures/*.png and metrics.json.

Contract: [write_report][normlab.lab.report.write_report] renders whatever the outcomes hold (a
figure that cannot be rendered turns its experiment into an error, the others are kept) and
always writes all four kinds of file. [run_report][normlab.lab.report.run_report] is the engine
behind `normlab report` and `normlab run`: resolve, run with progress, write, and return the
exit status.

The write is all or nothing (`normlab.lab._swap`): files are rendered into a new
hidden folder beside `out_dir`, which then replaces `out_dir` in one rename, under
`flock`s on the folders themselves. A reader never sees a half-written or mixed report
(two concurrent runs into one folder: the later swap wins, whole), figures of earlier runs
disappear, the sub-reports of `normlab run NAME` are carried over (a swap that fails
part-way puts them back; a report waits for a run that is writing inside its folder), and
an interrupt (Ctrl-C) before the swap leaves the previous report untouched.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from normlab.lab._swap import check_out_dir, staged_folder
from normlab.lab.experiments import load
from normlab.lab.plotting import figure_png
from normlab.lab.render import RenderedFigure, html_document, markdown_document
from normlab.lab.result import Settings
from normlab.lab.runner import Outcome, exit_status, run_experiments

__all__ = [
    "ReportFiles",
    "check_out_dir",
    "jsonable",
    "machine",
    "run_report",
    "versions",
    "write_report",
]

_PACKAGES = ("normlab", "numpy", "ml_dtypes", "numba", "matplotlib", "tqdm")


@dataclass(frozen=True)
class ReportFiles:
    """Paths of what was written.

    Attributes
    ----------
    markdown : pathlib.Path
        `report.md`.
    html : pathlib.Path
        `report.html` (figures embedded).
    metrics : pathlib.Path
        `metrics.json` (the raw numbers).
    figures : tuple of pathlib.Path
        `figures/*.png`.
    """

    markdown: Path
    html: Path
    metrics: Path
    figures: tuple[Path, ...]


def machine() -> dict[str, Any]:
    """Where the report ran: the CPU model, its logical cores, the OS, the load (for timings).

    `load_average_1min` is the system's load when the report is written (None where the OS
    does not tell): above the number of cores, other work shared the CPU and the wall times
    are longer than on an idle machine.

    Examples
    --------
    >>> sorted(machine())
    ['cpu', 'load_average_1min', 'logical_cores', 'platform']
    """
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            names = [line.split(":", 1)[1].strip() for line in info
                     if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:  # not Linux
        pass
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not POSIX
        load = None
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "platform": platform.platform(),
            "load_average_1min": load}


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children so far."""
    try:
        import resource
    except ImportError:  # not POSIX: this process only
        return time.process_time()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def versions() -> dict[str, str]:
    """Versions of Python and of the packages the lab uses ("not installed" if absent)."""
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def jsonable(value: Any) -> Any:
    """`value` with numpy scalars/arrays turned into Python ones; non-finite floats as strings.

    >>> jsonable({"a": float("inf"), "b": (1, 2)})
    {'a': 'inf', 'b': [1, 2]}
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return jsonable(value.tolist())
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def _render_figures(outcome: Outcome, out_dir: Path) -> list[RenderedFigure]:
    rendered: list[RenderedFigure] = []
    if outcome.result is None:
        return rendered
    try:
        for stem, fig in outcome.result.figures.items():
            relpath = f"figures/{outcome.name}-{stem}.png"
            png = figure_png(fig)
            (out_dir / relpath).write_bytes(png)
            rendered.append(RenderedFigure(stem, relpath, png))
    except Exception:
        outcome.status = "error"
        outcome.error = "rendering a figure failed:\n" + traceback.format_exc()
    return rendered


def _experiment_metrics(o: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "title": o.title,
        "status": o.status,
        "passed": o.status == "pass",
        "elapsed_s": round(o.elapsed_s, 3),
        "detects": list(o.detects),
    }
    if o.result is not None:
        entry["seed"] = o.result.seed
        entry["sizes"] = o.result.settings
        entry["checks"] = [asdict(c) for c in o.result.checks]
        entry["metrics"] = o.result.metrics
    if o.error is not None:
        entry["error"] = o.error
    return entry


def write_report(
    outcomes: Sequence[Outcome],
    out_dir: str | Path,
    settings: Settings,
    *,
    total_s: float,
    cpu_s: float | None = None,
) -> ReportFiles:
    """Write report.md, report.html, figures/*.png and metrics.json as the folder `out_dir`.

    Parameters
    ----------
    outcomes
        The experiments' outcomes, in report order (see [normlab.lab.runner][]).
    out_dir
        The report folder: created, or replaced whole if it holds an earlier report (sub-folders
        of `normlab run NAME` reports inside it are kept).
    settings
        The size and seed the experiments ran with (written in the header).
    total_s
        Wall time of the whole run, in seconds.
    cpu_s
        CPU time (user + system) of the whole run, in seconds, when it was measured.

    Returns
    -------
    ReportFiles
        The paths written (inside `out_dir`).

    Raises
    ------
    ValueError
        `out_dir` is a file, cannot be written, or holds files that are not a report (see
        [check_out_dir][normlab.lab.report.check_out_dir]); nothing is written then.
    """
    out = Path(out_dir)
    check_out_dir(out)
    with staged_folder(out) as stage:
        files = _write_files(outcomes, stage, settings, total_s=total_s, cpu_s=cpu_s)
    return ReportFiles(
        out / files.markdown.name,
        out / files.html.name,
        out / files.metrics.name,
        tuple(out / p.relative_to(stage) for p in files.figures),
    )


def _write_files(
    outcomes: Sequence[Outcome], out: Path, settings: Settings, *, total_s: float,
    cpu_s: float | None = None,
) -> ReportFiles:
    """Render every file of the report into the (new, empty) folder `out`."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    figures = {o.name: _render_figures(o, out) for o in outcomes}
    for o in outcomes:  # figures are written; free matplotlib's memory
        if o.result is not None:
            o.result.figures.clear()
    found = versions()
    meta = {
        "size": settings.size,
        "seed": settings.seed,
        "versions_text": ", ".join(f"{k} {v}" for k, v in found.items()),
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "total_s": total_s,
        "cpu_s": cpu_s,
    }
    md_path, html_path, json_path = out / "report.md", out / "report.html", out / "metrics.json"
    md_path.write_text(markdown_document(outcomes, figures, meta), encoding="utf-8")
    html_path.write_text(html_document(outcomes, figures, meta), encoding="utf-8")
    metrics = {
        "generated_utc": meta["generated"],
        "settings": {"size": settings.size, "seed": settings.seed},
        "versions": found,
        "machine": machine(),
        "total_elapsed_s": round(total_s, 3),
        "total_cpu_s": None if cpu_s is None else round(cpu_s, 3),
        "passed": exit_status(outcomes) == 0,
        "experiments": {o.name: _experiment_metrics(o) for o in outcomes},
    }
    json_path.write_text(
        json.dumps(jsonable(metrics), indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    paths = tuple(out / f.relpath for fs in figures.values() for f in fs)
    return ReportFiles(md_path, html_path, json_path, paths)


def run_report(
    names: Sequence[str],
    settings: Settings,
    out_dir: str | Path,
    *,
    show_progress: bool = False,
    loader: Callable[[str], Any] = load,
) -> tuple[int, list[Outcome], ReportFiles]:
    """Run `names` and write the report into `out_dir`: the engine of `normlab report`.

    Parameters
    ----------
    names
        Experiment names in report order ([normlab.lab.experiments.resolve][]).
    settings
        Size and seed for every experiment.
    out_dir
        Output folder.
    show_progress
        Tqdm bars on stderr (one per experiment plus the overall line).
    loader
        Maps a name to its module (default: import it from the registry).

    Returns
    -------
    status : int
        The exit status: 0 unless an experiment FAILs or raises an exception, then 1 (PASS,
        NOT REPRODUCED, INCONCLUSIVE and SKIPPED all give 0).
    outcomes : list of Outcome
        One per experiment, in order.
    files : ReportFiles
        What was written.

    Examples
    --------
    >>> status, outcomes, files = run_report(["invariance"], Settings("quick"), "out")
    ... # doctest: +SKIP
    """
    check_out_dir(out_dir)  # a bad folder is reported before any experiment runs
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    outcomes = run_experiments(names, settings, loader=loader, show_progress=show_progress)
    files = write_report(outcomes, out_dir, settings, total_s=time.perf_counter() - start,
                         cpu_s=_cpu_seconds() - cpu_start)
    return exit_status(outcomes), outcomes, files
