"""What an experiment hands to the report: checks (claim beside measurement), figures, tables.

Contract for every experiment module in :mod:`normlab.lab.experiments`:

* module constants ``NAME`` (the id used by ``normlab run NAME``) and ``TITLE``;
* ``run(settings: Settings, progress: Progress) -> ExperimentResult``;
* deterministic for a given ``settings.seed`` (all randomness from
  ``numpy.random.default_rng(settings.seed)`` or generators derived from it);
* budget: about 5 s at ``size="quick"``, 30 s at ``"default"`` on 2 cores; ``"full"`` may be larger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["Check", "ExperimentResult", "NullProgress", "Progress", "Settings"]

Size = Literal["quick", "default", "full"]


@dataclass(frozen=True)
class Settings:
    """How large to run an experiment, and its seed."""

    size: Size = "default"
    seed: int = 0

    def pick(self, quick: Any, default: Any, full: Any) -> Any:
        """Choose a setting by size: ``settings.pick(2, 8, 32)``."""
        return {"quick": quick, "default": default, "full": full}[self.size]


class Progress(Protocol):
    """Progress reporting for long work (a tqdm bar in the CLI, a no-op in tests)."""

    def start(self, total: int, description: str) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class NullProgress:
    """A Progress that shows nothing."""

    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass
class Check:
    """One claim of a paper beside the value measured here."""

    source: str  # "Xiong et al. 2020, Lemma 2"
    claim: str  # the paper's claim, in words
    criterion: str  # the pass criterion, in words, with its numbers
    measured: str  # the measured value(s), formatted for the table
    passed: bool
    values: dict[str, Any] = field(default_factory=dict)  # raw numbers for metrics.json


@dataclass
class ExperimentResult:
    """Everything an experiment reports."""

    name: str
    title: str
    seed: int
    summary: str  # a few sentences of markdown: what was run and what it shows
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # file stem -> matplotlib Figure
    tables: list[str] = field(default_factory=list)  # markdown tables
    metrics: dict[str, Any] = field(default_factory=dict)  # JSON-able measured values
    settings: dict[str, Any] = field(default_factory=dict)  # the sizes actually used

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)
