"""Rounding modes: a leaf module (it imports nothing from normlab).

The NumPy reference ([quantize][normlab.precision.quantize]), its numba kernel and the
torch twin all name their modes with [RoundingMode][normlab.precision.RoundingMode]; keeping
the enum here lets the kernels import it without importing the rounding reference, which
dispatches to them.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["REFERENCE_ONLY_MODES", "RoundingMode", "check_mode"]


class RoundingMode(enum.Enum):
    r"""Rounding modes of [quantize][normlab.precision.quantize] (the strings are accepted too).

    Attributes
    ----------
    NEAREST : str
        To nearest, ties to even (`"nearest"`).
    STOCHASTIC : str
        Up with probability equal to the fractional position (`"stochastic"`).
    TOWARD_ZERO : str
        Truncate the magnitude (`"toward_zero"`).
    NEAREST_AWAY : str
        To nearest, ties away from zero (`"nearest_away"`).
    TOWARD_POSITIVE : str
        Up to the next value $\ge x$, i.e. ceil (`"toward_positive"`).
    TOWARD_NEGATIVE : str
        Down to the next value $\le x$, i.e. floor (`"toward_negative"`).
    """

    NEAREST = "nearest"
    STOCHASTIC = "stochastic"
    TOWARD_ZERO = "toward_zero"
    NEAREST_AWAY = "nearest_away"
    TOWARD_POSITIVE = "toward_positive"
    TOWARD_NEGATIVE = "toward_negative"


REFERENCE_ONLY_MODES = frozenset({RoundingMode.TOWARD_POSITIVE, RoundingMode.TOWARD_NEGATIVE})
"""Modes served only by the NumPy reference (the numba kernel predates them)."""


def check_mode(rounding: Any) -> RoundingMode:
    """The [RoundingMode][normlab.precision.RoundingMode] named by `rounding`.

    Parameters
    ----------
    rounding : RoundingMode or str
        A mode or its string value.

    Returns
    -------
    mode : RoundingMode
        The mode.

    Raises
    ------
    ValueError
        If `rounding` names no mode (the message lists the modes).

    Examples
    --------
    >>> check_mode("nearest") is RoundingMode.NEAREST
    True
    """
    try:
        return RoundingMode(rounding)
    except ValueError:
        raise ValueError(
            f"rounding must be one of {[r.value for r in RoundingMode]}; got {rounding!r}"
        ) from None
