"""Shared fixtures of the lab tests: each experiment run once per session at its quick size."""

from __future__ import annotations

from typing import Any

import pytest

from normlab.lab.experiments import load
from normlab.lab.result import ExperimentResult, NullProgress, Settings


class _QuickResults:
    """``quick_results[name]``: the experiment's result at Settings("quick", 0), run once."""

    def __init__(self) -> None:
        self._done: dict[str, ExperimentResult] = {}

    def __getitem__(self, name: str) -> ExperimentResult:
        if name not in self._done:
            self._done[name] = load(name).run(Settings("quick", 0), NullProgress())
        return self._done[name]


@pytest.fixture(scope="session")
def quick_results() -> Any:
    return _QuickResults()
