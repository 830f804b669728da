"""Progress bars for the CLI: one tqdm bar per experiment plus an overall line.

[TqdmProgress][normlab.lab.progress.TqdmProgress] implements the [normlab.lab.result.Progress][]
protocol that experiments drive (`start(total, description)` then `advance(n)`); an experiment
may call `start` several times (one bar per phase). Bars go to stderr so stdout stays clean, and
only when stderr is a terminal: a log file or a pipe gets no carriage-return redraws.
"""

from __future__ import annotations

import sys
from typing import Any

from normlab.lab._deps import require

__all__ = ["OverallProgress", "TqdmProgress", "stderr_is_terminal"]


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (bars are drawn only there)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class TqdmProgress:
    """A Progress that shows a tqdm bar below the overall line (position 1)."""

    def __init__(self, *, disable: bool = False) -> None:
        self._tqdm = require("tqdm").tqdm
        self._bar: Any = None
        self._disable = disable or not stderr_is_terminal()

    def start(self, total: int, description: str) -> None:
        """Close the current bar and open one of `total` units, labelled `description`."""
        self.close()
        self._bar = self._tqdm(
            total=total,
            desc=f"  {description}",
            position=1,
            leave=False,
            file=sys.stderr,
            disable=self._disable,
            dynamic_ncols=True,
        )

    def advance(self, n: int = 1) -> None:
        """Move the current bar on by `n` units."""
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Close the current bar, if any."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class OverallProgress:
    """The overall line: experiments done out of those selected, with the current name."""

    def __init__(self, total: int, *, disable: bool = False) -> None:
        tqdm = require("tqdm").tqdm
        self._bar = tqdm(
            total=total,
            desc="normlab report",
            unit="exp",
            position=0,
            file=sys.stderr,
            disable=disable or not stderr_is_terminal(),
            dynamic_ncols=True,
        )

    def begin(self, name: str) -> None:
        """Show `name` as the experiment now running."""
        self._bar.set_postfix_str(name)

    def done(self) -> None:
        """Count one more experiment as done."""
        self._bar.update(1)

    def close(self) -> None:
        """Close the overall line."""
        self._bar.close()
