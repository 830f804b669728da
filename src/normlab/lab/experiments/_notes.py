"""Summary sentences shared by the experiments: what did not reproduce, with its numbers."""

from __future__ import annotations

from collections.abc import Sequence

from normlab.lab.result import Check

__all__ = ["not_reproduced"]


def not_reproduced(checks: Sequence[Check]) -> str:
    """" Not reproduced at this size: <claim> (measured ...); ..." or "" when all passed.

    >>> not_reproduced([Check("s", "x grows", "slope > 0", "slope -0.1", False)])
    ' Not reproduced at this size: x grows (measured slope -0.1).'
    """
    failed = [f"{c.claim} (measured {c.measured})" for c in checks if not c.passed]
    return f" Not reproduced at this size: {'; '.join(failed)}." if failed else ""
