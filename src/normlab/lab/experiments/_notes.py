"""Summary sentences shared by the experiments: what did not reproduce, with its numbers."""

from __future__ import annotations

from collections.abc import Sequence

from normlab.lab.result import Check

__all__ = ["not_reproduced"]


def not_reproduced(checks: Sequence[Check]) -> str:
    """" Not reproduced at this size: <claim> (measured ...)." and " Inconclusive at this
    size: ..." for the checks with those verdicts, or "" when all passed.

    >>> not_reproduced([Check("s", "x grows", "slope > 0", "slope -0.1", False)])
    ' Not reproduced at this size: x grows (measured slope -0.1).'
    >>> not_reproduced([Check("s", "x grows", "slope > 0", "slope 0.0 (se 0.1)", False,
    ...                       if_false="INCONCLUSIVE")])
    ' Inconclusive at this size: x grows (measured slope 0.0 (se 0.1)).'
    """
    out = ""
    for word, verdicts in (("Not reproduced", ("FAIL", "NOT REPRODUCED")),
                           ("Inconclusive", ("INCONCLUSIVE",))):
        found = [f"{c.claim} (measured {c.measured})" for c in checks
                 if not c.passed and c.verdict in verdicts]
        if found:
            out += f" {word} at this size: {'; '.join(found)}."
    return out
