"""float32 master weights and the low-precision working copy the model computes with.

Contract: [MasterWeights][normlab.precision.MasterWeights] owns a float32 master per parameter
(the optimizer updates those) and writes `quantize(master, fmt)` into each parameter's `.data`;
it notices a replaced `.data` array (a module load) before it writes again, and its state dict
restores masters and working values exactly. Micikevicius et al., "Mixed Precision Training",
ICLR 2018.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_bool,
    check_generator,
    check_mapping,
    check_shape,
    check_writeable,
    optional_grad,
)
from normlab.precision.formats.format import Format, get_format
from normlab.precision.formats.rounding import quantize

__all__ = ["MasterWeights"]


class _Master:
    """A float32 master parameter: `.data` and `.grad` like any optimizer parameter."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.grad: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"_Master(shape={self.data.shape}, dtype={self.data.dtype})"


class MasterWeights:
    """float32 masters for `params` and their working copy rounded to `fmt`.

    `working = quantize(master, fmt)`, written into each `param.data` (in its own dtype,
    which must hold fmt's values: float32 holds every format up to float32). Build the
    optimizer on `masters` (`AdamW(mw.masters)`), never on the working parameters.

    Parameters
    ----------
    params : iterable
        Objects with `.data` (float ndarray, any byte order) and `.grad`: the model's
        parameters.
    fmt : Format or str
        The working format: a [Format][normlab.precision.Format] or a name (`"bf16"`,
        `"fp16"`, `"e4m3"`, ...).
    rounding : str
        How the working copy is rounded: `"nearest"` (default) or `"stochastic"` (with
        `rng`).
    saturate : bool
        Passed to `quantize` (fp8 without inf: clip to max).
    rng : numpy.random.Generator, optional
        The randomness of stochastic rounding.

    Attributes
    ----------
    masters : list
        The float32 master parameters (objects with `.data` and `.grad`), one per param.
    working : list
        The caller's parameters, in the order given.
    fmt : Format
        The working format.
    rounding : str
        The rounding mode of the working copy.
    saturate : bool
        Whether the working copy saturates at the format's max.
    rng : numpy.random.Generator or None
        The randomness of stochastic rounding.

    Notes
    -----
    A parameter whose `.data` array is *replaced* (`Module.load_state_dict` does so) is
    seen before the next step, refresh or state_dict: when the new values differ from what
    was last written, its master is re-read from them (so a loaded model is never
    overwritten by stale masters); when they are equal (a module checkpoint of the same
    run) the float32 master is kept. Values written *in place* into `.data` are not
    seen; call [sync][normlab.precision.MasterWeights.sync] with `force=True` after such a
    write.

    Examples
    --------
    >>> import types
    >>> p = types.SimpleNamespace(data=np.array([1 + 2**-10], np.float32), grad=None)
    >>> mw = MasterWeights([p], "bf16"); p.data.tolist(), mw.masters[0].data.tolist()
    ([1.0], [1.0009765625])
    """

    def __init__(
        self,
        params: Iterable[Any],
        fmt: Format | str,
        *,
        rounding: str = "nearest",
        saturate: bool = False,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.fmt = get_format(fmt)
        if isinstance(params, np.ndarray) or not isinstance(params, Iterable):
            raise TypeError("params must be an iterable of objects with .data and .grad; "
                            f"got {type(params).__name__}")
        plist = list(params)
        if not plist:
            raise ValueError("params is empty: there is nothing to keep master weights for")
        for i, p in enumerate(plist):
            if not isinstance(getattr(p, "data", None), np.ndarray) or not hasattr(p, "grad"):
                raise TypeError(f"params[{i}] must have .data (an ndarray) and .grad")
            as_float_array(p.data, f"params[{i}].data")
        saturate = check_bool(saturate, "saturate")
        if rng is not None or rounding == "stochastic":
            check_generator(rng)
        # validates rounding, saturate and rng against fmt without drawing a random number
        quantize(np.zeros(0, np.float32), self.fmt, rounding=rounding, saturate=saturate, rng=rng)
        self.rounding, self.saturate, self.rng = rounding, saturate, rng
        self.working = plist
        self.masters = [_Master(p.data.astype(np.float32)) for p in plist]
        self._written: list[np.ndarray | None] = [None] * len(plist)
        self.refresh()

    @property
    def params(self) -> list[_Master]:
        """Deprecated alias of `masters` (the name said "params" but held the masters)."""
        warnings.warn("MasterWeights.params is deprecated; use MasterWeights.masters (the "
                      "float32 masters; .working holds your parameters)",
                      DeprecationWarning, stacklevel=2)
        return self.masters

    def sync(self, *, force: bool = False) -> None:
        """Re-read masters from working weights that changed outside (see Notes).

        With `force=True` every master is re-read from its working values.
        """
        force = check_bool(force, "force")
        replaced = []
        for i, (w, m) in enumerate(zip(self.working, self.masters, strict=True)):
            data = w.data
            if force or data is not self._written[i]:
                if not isinstance(data, np.ndarray):
                    raise TypeError(f"params[{i}].data must be an ndarray; got {type(data)}")
                check_shape(as_float_array(data, f"params[{i}].data"), m.data.shape,
                            f"params[{i}].data", "the shape of its master (fixed at creation)")
                replaced.append(i)
        for i in replaced:  # everything checked: now adopt
            data, old = self.working[i].data, self._written[i]
            if force or old is None or not np.array_equal(data, old, equal_nan=True):
                self.masters[i].data[...] = data.astype(np.float32)
            self._written[i] = data

    def refresh(self) -> None:
        """Write `quantize(master, fmt)` into every working `.data` (before a forward)."""
        self.sync()
        self._check_writeable()
        self._write([
            quantize(m.data, self.fmt, rounding=self.rounding, saturate=self.saturate,
                     rng=self.rng)
            for m in self.masters
        ])

    def _check_writeable(self) -> None:
        for i, w in enumerate(self.working):
            check_writeable(w.data, f"params[{i}].data", "the working copy is written in place")

    def _write(self, values: Sequence[np.ndarray]) -> None:
        for i, (w, q) in enumerate(zip(self.working, values, strict=True)):
            w.data[...] = q.astype(w.data.dtype)
            self._written[i] = w.data

    def grads(self) -> list[np.ndarray | None]:
        """The working copy's gradients (what the loss scaler unscales), validated."""
        return [
            optional_grad(w.grad, m.data.shape, f"params[{i}].grad")
            for i, (w, m) in enumerate(zip(self.working, self.masters, strict=True))
        ]

    def copy_grads_to_masters(self) -> None:
        """`master.grad = float32(working.grad)` (None stays None), after `sync`."""
        grads = self.grads()
        self.sync()
        for g, m in zip(grads, self.masters, strict=True):
            m.grad = None if g is None else g.astype(np.float32)

    def state_dict(self) -> dict[str, np.ndarray]:
        """`{"masters.i": float32 master, "working.i": float32 working values}`, copies.

        The working values are kept so that loading restores them exactly, without
        rounding again (stochastic rounding would draw new random numbers). Flat, so
        `np.savez(f, **mw.state_dict())` works.
        """
        self.sync()
        state: dict[str, np.ndarray] = {}
        for i, (w, m) in enumerate(zip(self.working, self.masters, strict=True)):
            state[f"masters.{i}"] = m.data.copy()
            state[f"working.{i}"] = np.asarray(w.data, dtype=np.float32).copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore masters and working values from `state_dict` (checked first).

        Raises
        ------
        TypeError, ValueError
            On a missing or unexpected key or a wrong shape; nothing changes then.
        """
        check_mapping(state, "state", "a MasterWeights state dict")
        n = len(self.masters)
        expected = {f"{kind}.{i}" for kind in ("masters", "working") for i in range(n)}
        missing = sorted(expected - set(state))
        unexpected = sorted(str(k) for k in set(state) - expected)
        if missing or unexpected:
            raise ValueError(f"state keys must be masters.0..{n - 1} and working.0..{n - 1}; "
                             f"missing {missing}, unexpected {unexpected}")
        masters: list[np.ndarray] = []
        working: list[np.ndarray] = []
        for i, m in enumerate(self.masters):
            for kind, out in (("masters", masters), ("working", working)):
                name = f"state['{kind}.{i}']"
                arr = as_float_array(state[f"{kind}.{i}"], name)
                check_shape(arr, m.data.shape, name, f"the shape of params[{i}]")
                out.append(arr.astype(np.float32))
        self._check_writeable()
        for m, arr in zip(self.masters, masters, strict=True):
            m.data[...] = arr
        self._write(working)
