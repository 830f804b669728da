"""Weights held in a low-precision format itself, updated without a master copy.

Contract: [LowPrecisionUpdater][normlab.precision.LowPrecisionUpdater] rounds `w + delta` back
to its format after every update (the comparison for fp32 master weights,
`normlab.precision.training.mixed_step`). The Kahan mode keeps one compensation buffer per
weight array, numbered in the order the arrays were first passed to `apply`; `state_dict` /
`load_state_dict` save and restore them.

Zamirai et al., "Revisiting BFloat16 Training", 2020 (stochastic rounding, Kahan updates).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from normlab._moved import renamed_arguments
from normlab._validate import (
    as_float_array,
    check_generator,
    check_mapping,
    check_shape,
    check_writeable,
    scalar_item,
)
from normlab.precision.formats.format import Format, get_format
from normlab.precision.formats.rounding import quantize

__all__ = ["LowPrecisionUpdater", "kahan_add"]

_UPDATE_MODES = ("nearest", "stochastic", "kahan")


def kahan_add(w: Any, delta: Any, c: Any, rnd: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Kahan's compensated `w + delta` in a low-precision format, on any array type.

    `y = rnd(delta - c)`, `s = rnd(w + y)`, new compensation `rnd(rnd(s - w) - y)`:
    what the rounding `rnd` dropped from this step is carried into the next (Zamirai et
    al. 2020). The NumPy updater and the torch AdamW both call this.

    Returns
    -------
    new : array
        `s`, the updated weights.
    compensation : array
        The new compensation.
    """
    y = rnd(delta - c)
    s = rnd(w + y)
    return s, rnd(rnd(s - w) - y)


class LowPrecisionUpdater:
    """Update weights stored in `fmt` itself (no master copy): `w <- round(w + delta)`.

    Roundings (`param_rounding`, the name [normlab.torch.AdamW][] uses too): `"nearest"`
    (ties to even: updates below half an ulp of w are lost), `"stochastic"` (unbiased:
    E[round(w + d)] = w + d; needs `rng`), `"kahan"` (compensated:
    `y = d - c; s = w + y; c = (s - w) - y; w = s`, every operation rounded to fmt and the
    compensation `c` stored in fmt, one buffer per weight array; Zamirai et al. 2020).
    `w + delta` is formed in float64 and rounded once.

    Parameters
    ----------
    fmt : Format or str
        The storage format of the weights.
    param_rounding : {"nearest", "stochastic", "kahan"}
        How each update is rounded (see above). Default `"nearest"`. (The keyword was
        `mode` before; `mode=` still works, with a DeprecationWarning.)
    rng : numpy.random.Generator, optional
        The randomness of `"stochastic"` (required there).

    Attributes
    ----------
    fmt : Format
        The storage format.
    param_rounding : str
        How each update is rounded.
    mode : str
        The same as `param_rounding` (its old name, read-only).
    rng : numpy.random.Generator or None
        The randomness of `"stochastic"`.

    Examples
    --------
    >>> w = np.ones(1, np.float32); up = LowPrecisionUpdater("bf16", "kahan")
    >>> for _ in range(8): up.apply(w, np.full(1, 2.0**-10, np.float32))
    >>> w.tolist()  # round-to-nearest would have stayed at 1.0
    [1.0078125]
    """

    @renamed_arguments(mode="param_rounding")
    def __init__(self, fmt: Format | str, param_rounding: str = "nearest",
                 rng: np.random.Generator | None = None) -> None:
        self.fmt = get_format(fmt)
        if param_rounding not in _UPDATE_MODES:
            raise ValueError(f"param_rounding must be one of {_UPDATE_MODES}; "
                             f"got {param_rounding!r}")
        if param_rounding == "stochastic" or rng is not None:
            check_generator(rng)
        self.param_rounding, self.rng = param_rounding, rng
        # id(weights) -> (weights, compensation); insertion order numbers the buffers
        self._comp: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._pending: list[np.ndarray] = []  # loaded buffers not yet bound to an array

    @property
    def mode(self) -> str:
        """`param_rounding` under its old name."""
        return self.param_rounding

    def _q(self, x: np.ndarray, rounding: str = "nearest") -> np.ndarray:
        return quantize(x, self.fmt, rounding=rounding, rng=self.rng)

    def compensation(self, weights: np.ndarray) -> np.ndarray:
        """The Kahan compensation buffer of `weights` (zeros before the first update).

        A new array takes the next buffer loaded by
        [load_state_dict][normlab.precision.LowPrecisionUpdater.load_state_dict], if any (its
        shape must match).
        """
        entry = self._comp.get(id(weights))
        if entry is not None and entry[0] is weights:
            return entry[1]
        if self._pending:
            check_shape(weights, self._pending[0].shape, "weights",
                        f"the shape of loaded compensation buffer {len(self._comp)}")
            comp = self._pending.pop(0)
        else:
            comp = np.zeros(weights.shape, np.float64)
        self._comp[id(weights)] = (weights, comp)
        return comp

    def apply(self, weights: np.ndarray, delta: Any) -> None:
        """`weights <- round(weights + delta)` in place (weights hold values of fmt)."""
        if not isinstance(weights, np.ndarray):
            raise TypeError(f"weights must be an ndarray (updated in place); got {type(weights)}")
        w = as_float_array(weights, "weights")
        check_writeable(weights, "weights")
        d = as_float_array(delta, "delta")
        check_shape(d, w.shape, "delta", "the shape of weights")
        w64, d64 = w.astype(np.float64), d.astype(np.float64)
        if self.param_rounding == "kahan":
            c = self.compensation(weights)
            new, c[...] = kahan_add(w64, d64, c, self._q)
        else:
            new = self._q(w64 + d64, self.param_rounding)
        weights[...] = new.astype(weights.dtype)

    def state_dict(self) -> dict[str, Any]:
        """`{"param_rounding", "format", "compensation.k": float64 buffer k}` (copies, flat).

        Buffers are numbered in the order their arrays were first updated; buffers loaded
        but not yet bound keep their numbers after the bound ones.
        """
        state: dict[str, Any] = {"param_rounding": self.param_rounding, "format": self.fmt.name}
        buffers = [c for _, c in self._comp.values()] + self._pending
        for k, c in enumerate(buffers):
            state[f"compensation.{k}"] = c.copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any],
                        weights: Sequence[np.ndarray] | None = None) -> None:
        """Restore the compensation buffers of `state_dict`.

        `weights`: the arrays the buffers belong to, in their numbering order (checked now);
        without it, buffer k goes to the k-th new array passed to
        [apply][normlab.precision.LowPrecisionUpdater.apply] (checked then), which is the order
        of an identical training loop. Rounding and format must match this updater's (a state
        saved before the rename holds the rounding under `"mode"`: accepted). Everything is
        checked before anything is replaced.

        Raises
        ------
        TypeError, ValueError
            on a missing, unexpected or mismatching entry.
        """
        check_mapping(state, "state", "a LowPrecisionUpdater state dict")
        rounding = "mode" if "mode" in state and "param_rounding" not in state else "param_rounding"
        for key, mine in ((rounding, self.param_rounding), ("format", self.fmt.name)):
            got = scalar_item(state.get(key), f"state[{key!r}]")
            if got != mine:
                raise ValueError(f"state[{key!r}] must be {mine!r} (this updater's); got {got!r}")
        n = len(state) - 2
        expected = {rounding, "format", *(f"compensation.{k}" for k in range(n))}
        if set(state) != expected:
            raise ValueError(f"state keys must be {rounding!r}, 'format' and compensation.0.."
                             f"compensation.{n - 1}; got {sorted(map(str, state))}")
        buffers = [
            np.array(as_float_array(state[f"compensation.{k}"], f"state['compensation.{k}']"),
                     dtype=np.float64, copy=True)
            for k in range(n)
        ]
        bound: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if weights is not None:
            if len(weights) != n:
                raise ValueError(f"weights must hold one array per buffer ({n}); "
                                 f"got {len(weights)}")
            for k, (w, c) in enumerate(zip(weights, buffers, strict=True)):
                if not isinstance(w, np.ndarray):
                    raise TypeError(f"weights[{k}] must be an ndarray; got {type(w).__name__}")
                check_shape(w, c.shape, f"weights[{k}]", f"the shape of buffer {k}")
                bound[id(w)] = (w, c)
            buffers = []
        self._comp, self._pending = bound, buffers
