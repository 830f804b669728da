"""What an experiment hands to the report: checks (claim beside measurement), figures, tables.

Contract for every experiment module in [normlab.lab.experiments][]:

* the module constants of [CONTRACT][normlab.lab.result.CONTRACT]: `NAME` (the id used by
  `normlab run NAME`), `TITLE`, and `DETECTS: tuple[str, ...]`, the breaks of the library
  that the experiment is known to detect (short text, e.g. `"pre/post placement swapped"`),
  each proven by a fault-injection test in `tests/lab/test_breaks*.py` that breaks the
  mechanism, runs the experiment at its quick size and asserts the status FAIL; the
  report prints the list under the experiment. They are documented here once: an
  experiment's page shows each with the text of `CONTRACT`;
* the code in three steps, so a criterion reads in a few lines: `measure` (the numbers),
  `checks` (claim, criterion, verdict from those numbers) and `tables`/figures;
* `run(settings: Settings, progress: Progress) -> ExperimentResult`;
* deterministic for a given `settings.seed` (all randomness from
  `numpy.random.default_rng(settings.seed)` or generators derived from it);
* a claim of a paper that depends on random draws is measured over replicates and decided
  from its interval by [normlab.lab.replicates.decide][] (`judged` builds the check); only
  exact checks of a mechanism are plain pass/fail;
* budget: the whole report within 90 s at `size="quick"` and 6 minutes at `"default"` on
  2 cores (most experiments take seconds, the trained ones up to a minute or two);
  `"full"` may be larger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "CONTRACT",
    "Check",
    "ExperimentResult",
    "ExperimentSkipped",
    "NullProgress",
    "Progress",
    "Settings",
    "Verdict",
]

CONTRACT: dict[str, str] = {
    "NAME": "The experiment's id in the registry and on the command line (`normlab run NAME`).",
    "TITLE": "The experiment's title: the heading of its section in the report and of its page.",
    "DETECTS": (
        "The library breaks this experiment turns into a FAIL, each proven by a "
        "fault-injection test (the contract of [normlab.lab.result][])."
    ),
}
"""The module constants every experiment declares, and what each holds.

The one text of each: an experiment module defines the constants without a docstring, and
the documentation shows each with its text here.
"""

Size = Literal["quick", "default", "full"]
"""How large an experiment runs (`--quick`, the default, `--full`)."""
Verdict = Literal["PASS", "FAIL", "NOT REPRODUCED", "INCONCLUSIVE"]
"""The verdict of a check or an experiment (see [Check][normlab.lab.result.Check])."""


class ExperimentSkipped(Exception):
    """Raised by `run` when an optional dependency is missing.

    The message says how to install it. The runner reports the experiment as `"skipped"`,
    not as a failure.
    """


@dataclass(frozen=True)
class Settings:
    """How large to run an experiment, and its seed.

    Attributes
    ----------
    size : {"quick", "default", "full"}
        `"quick"` (a smoke run: the whole report within 90 s on 2 cores), `"default"` (within
        6 minutes; decides the claims) or `"full"` (more replicates).
    seed : int
        The seed of all the experiment's randomness.
    """

    size: Size = "default"
    seed: int = 0

    def pick(self, quick: Any, default: Any, full: Any) -> Any:
        """Choose a setting by size: `settings.pick(2, 8, 32)`."""
        return {"quick": quick, "default": default, "full": full}[self.size]


class Progress(Protocol):
    """Progress reporting for long work (a tqdm bar in the CLI, a no-op in tests)."""

    def start(self, total: int, description: str) -> None:
        """Begin a piece of work of `total` units, labelled `description`."""
        ...

    def advance(self, n: int = 1) -> None:
        """Mark `n` more units done."""
        ...


class NullProgress:
    """A Progress that shows nothing."""

    def start(self, total: int, description: str) -> None:
        """Do nothing."""

    def advance(self, n: int = 1) -> None:
        """Do nothing."""


@dataclass
class Check:
    """One claim of a paper beside the value measured here.

    Attributes
    ----------
    source : str
        Where the claim comes from, e.g. `"Xiong et al. 2020, Lemma 2"`.
    claim : str
        The paper's claim, in words.
    criterion : str
        The pass criterion, in words, with its numbers.
    measured : str
        The measured value(s), formatted for the table.
    passed : bool
        Whether the criterion holds.
    values : dict
        The raw numbers, for `metrics.json`.
    if_false : Verdict
        What a False `passed` means: `"FAIL"` (the lab's criterion caught a broken
        mechanism), `"NOT REPRODUCED"` (a claim of the paper that this setting
        measurably does not show; an honest result with its numbers, not a defect of the
        code) or `"INCONCLUSIVE"` (the measured effect is below what this run can resolve;
        the criterion states the smallest effect the run could have detected).
    interval : Interval or None
        For a claim decided from replicates: the effect, its 95% interval, the number of
        replicates and what each replicate's number is
        ([normlab.lab.replicates.Interval][]); None for an exact check of a mechanism.
    """

    source: str
    claim: str
    criterion: str
    measured: str
    passed: bool
    values: dict[str, Any] = field(default_factory=dict)
    if_false: Verdict = "FAIL"
    interval: Any = None  # a normlab.lab.replicates.Interval (not imported: no cycle)

    @property
    def verdict(self) -> Verdict:
        """`"PASS"` when passed, else [if_false][normlab.lab.result.Check.if_false]."""
        return "PASS" if self.passed else self.if_false


@dataclass
class ExperimentResult:
    """Everything an experiment reports.

    Attributes
    ----------
    name : str
        The experiment's `NAME`.
    title : str
        Its `TITLE`.
    seed : int
        The seed it ran with.
    summary : str
        A few sentences of Markdown: what was run and what it shows.
    checks : list of Check
        The claims beside their measurements.
    figures : dict
        File stem -> matplotlib Figure.
    tables : list of str
        Markdown tables.
    metrics : dict
        JSON-able measured values (for `metrics.json`).
    settings : dict
        The sizes actually used.
    """

    name: str
    title: str
    seed: int
    summary: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def verdict(self) -> Verdict:
        """FAIL if any check fails, else NOT REPRODUCED if any claim is measurably not
        reproduced, else INCONCLUSIVE if any check could not resolve its effect, else PASS."""
        words = {c.verdict for c in self.checks}
        if not self.checks or "FAIL" in words:
            return "FAIL"
        if "NOT REPRODUCED" in words:
            return "NOT REPRODUCED"
        return "INCONCLUSIVE" if "INCONCLUSIVE" in words else "PASS"
