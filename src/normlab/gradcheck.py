"""Finite-difference gradient checks usable on any forward/backward pair.

Contract: `forward(*inputs)` returns `(out_1, ..., out_k, cache)` and `backward(dout_1, ...,
dout_k, cache)` returns one gradient (or None) per input, in the order of the inputs (missing
trailing entries count as None). [gradcheck][normlab.gradcheck.gradcheck] draws random upstream
gradients `dout_i` and checks the analytic gradient of the scalar

    L = sum_i <dout_i, out_i>

against central differences `(L(x + h v) - L(x - h v)) / (2 h)` in float64: along every
coordinate (`mode="full"`) or along random unit directions (`mode="directional"`, cheap
for big inputs). Every float array input is checked through a float64 working copy (the
caller's arrays are never modified), and every array input (plus the optional `state`
arrays) is restored from a snapshot before each evaluation, so forwards that update state in
place (BatchNorm's running statistics) see the same state every time.

The error of one input is relative to the scale of its gradient:
`max|a - n| / (max(|a|, |n|) + floor)` over coordinates in full mode, and
`|<a, v> - n_v| / (||a||_2 + floor)` over unit directions v in directional mode (the
Cauchy-Schwarz bound of `<a, v>`, so a direction nearly orthogonal to the gradient does
not inflate the error). With h = 1e-6 a correct float64 backward typically scores 1e-8 or
less; a wrong term scores O(1).
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_generator,
    check_int,
    check_nonneg,
    check_positive,
    check_writeable,
    is_float_dtype,
)

__all__ = ["GradcheckError", "gradcheck"]

_MODES = ("full", "directional")


class GradcheckError(AssertionError):
    """Raised by `gradcheck(..., tol=...)` when an analytic gradient is wrong.

    The message lists every checked input with its error and the worst coordinate or
    direction. It is an `AssertionError`, so a failed check reads as a failed test.
    """


@dataclass(frozen=True)
class _Finding:
    name: str
    error: float
    where: str  # the worst coordinate or direction
    analytic: float
    numeric: float

    def line(self) -> str:
        return (f"  {self.name}: relative error {self.error:.3e} at {self.where} "
                f"(analytic {self.analytic:.10g}, numeric {self.numeric:.10g})")


class _Harness:
    """Working copies, snapshots and the scalar loss L = sum <dout_i, out_i>."""

    def __init__(self, forward: Callable[..., Any], inputs: Sequence[Any],
                 state: Sequence[np.ndarray]) -> None:
        self.forward = forward
        self.work = [
            np.array(a, dtype=np.float64) if isinstance(a, np.ndarray) and is_float_dtype(a.dtype)
            else (a.copy() if isinstance(a, np.ndarray) else a)
            for a in inputs
        ]
        self.arrays = [a for a in self.work if isinstance(a, np.ndarray)] + list(state)
        self.snapshots = [a.copy() for a in self.arrays]
        self.douts: list[np.ndarray | None] = []

    def restore(self) -> None:
        for arr, snap in zip(self.arrays, self.snapshots, strict=True):
            arr[...] = snap

    def run(self, i: int = -1, delta: np.ndarray | float = 0.0,
            idx: tuple[int, ...] | None = None) -> tuple[list[Any], Any]:
        """Restore every array, add `delta` to input i (at `idx` if given), run forward."""
        self.restore()
        if i >= 0:
            if idx is None:
                self.work[i] += delta
            else:
                self.work[i][idx] += delta
        result = self.forward(*self.work)
        if not isinstance(result, tuple) or len(result) < 2:
            raise TypeError("forward must return a tuple (out_1, ..., out_k, cache); "
                            f"got {type(result).__name__}")
        return list(result[:-1]), result[-1]

    def loss(self, i: int, delta: np.ndarray | float, idx: tuple[int, ...] | None) -> float:
        outs, _ = self.run(i, delta, idx)
        return math.fsum(
            float(np.sum(d * np.asarray(o, dtype=np.float64)))
            for d, o in zip(self.douts, outs, strict=True) if d is not None
        )

    def derivative(self, i: int, direction: np.ndarray | tuple[int, ...], h: float) -> float:
        """Central difference of L along a unit direction array or one coordinate (index)."""
        if isinstance(direction, np.ndarray):
            plus, minus = self.loss(i, h * direction, None), self.loss(i, -h * direction, None)
        else:
            plus, minus = self.loss(i, h, direction), self.loss(i, -h, direction)
        return (plus - minus) / (2.0 * h)


def _grads_of(result: Any) -> list[Any]:
    if not isinstance(result, (tuple, list)):
        raise TypeError("backward must return a tuple or list with one gradient (or None) per "
                        f"input; got {type(result).__name__} {result!r:.80}")
    return list(result)


def _check_input(work: list[Any], i: int, grad: Any) -> np.ndarray:
    if not isinstance(work[i], np.ndarray) or work[i].dtype != np.float64:
        raise TypeError(f"wrt: input {i} must be a float array; got {type(work[i]).__name__}")
    if grad is None:
        raise ValueError(f"wrt: backward returned no gradient (None) for input {i}")
    g = as_float_array(grad, f"backward's gradient for input {i}").astype(np.float64)
    if g.shape != work[i].shape:
        raise ValueError(f"backward's gradient for input {i} has shape {g.shape}; "
                         f"the input has shape {work[i].shape}")
    return g


def gradcheck(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    rng: np.random.Generator,
    wrt: Sequence[int] | None = None,
    mode: str = "full",
    num_directions: int = 4,
    h: float = 1e-6,
    floor: float = 1e-10,
    tol: float | None = None,
    names: Sequence[str] | None = None,
    state: Sequence[np.ndarray] = (),
) -> float:
    r"""Largest relative error between analytic and finite-difference gradients.

    $$
    \frac{\partial L}{\partial x} \cdot v \approx
    \frac{L(x + h v) - L(x - h v)}{2h},\quad L = \sum_i \langle \bar y_i, y_i \rangle
    $$

    (central differences, error O(h^2); see scipy's `check_grad` and
    `torch.autograd.gradcheck` for the same idea.)

    Parameters
    ----------
    forward
        `forward(*inputs) -> (out_1, ..., out_k, cache)`.
    backward
        `backward(dout_1, ..., dout_k, cache) -> (grad_0, grad_1, ...)`, one per input (None for
        inputs without a gradient).
    inputs
        The arguments of forward; float arrays are used as float64 copies.
    rng
        `numpy.random.Generator` for the upstream gradients and the directions.
    wrt
        Indices of the inputs to check (default: every input with a non-None gradient).
    mode
        `"full"` (every coordinate, 2 forwards each) or `"directional"` (`num_directions` random
        unit directions per input).
    num_directions
        Directions per input in directional mode (>= 1).
    h
        Finite-difference step (> 0).
    floor
        Added to the error's denominator (> 0).
    tol
        When given, raise [GradcheckError][normlab.GradcheckError] with a per-input report if
        the error exceeds it.
    names
        Labels of the inputs for the report (default `input 0`, `input 1` ...).
    state
        Extra arrays (e.g. a module's running statistics) restored in place from a snapshot
        before each evaluation and at the end.

    Returns
    -------
    float
        The maximum relative error over the checked inputs (0.0 when none are checked).

    Raises
    ------
    GradcheckError
        Error above `tol`.
    TypeError, ValueError
        Bad arguments, a forward that does not return `(..., cache)`, a gradient of the
        wrong shape.

    Examples
    --------
    >>> from normlab import layer_norm_forward, layer_norm_backward
    >>> x, g, b = np.random.default_rng(0).standard_normal((4, 5)), np.ones(5), np.zeros(5)
    >>> err = gradcheck(layer_norm_forward, layer_norm_backward, (x, g, b),
    ...                 rng=np.random.default_rng(1))
    >>> err < 1e-6
    True
    """
    args = _check_args(forward, backward, inputs, rng, wrt, mode, num_directions, h, floor,
                       tol, names, state)
    inputs, wrt, num_directions, h, floor = args
    harness = _Harness(forward, inputs, state)
    try:
        outs, cache = harness.run()
        harness.douts = [None if o is None else rng.standard_normal(np.shape(o)) for o in outs]
        grads = _grads_of(backward(*harness.douts, cache))
        grads += [None] * (len(harness.work) - len(grads))
        if wrt is None:
            wrt = [i for i, g in enumerate(grads[: len(harness.work)]) if g is not None]
        label = (lambda i: names[i]) if names is not None else (lambda i: f"input {i}")
        findings = [
            _check_one(harness, i, _check_input(harness.work, i, grads[i]), label(i), mode,
                       num_directions, h, floor, rng)
            for i in wrt
        ]
    finally:
        harness.restore()
    worst = max((f.error for f in findings), default=0.0)
    if tol is not None and not worst <= tol:
        report = "\n".join(f.line() for f in findings)
        raise GradcheckError(f"gradient check failed ({mode}, h={h:g}): max relative error "
                             f"{worst:.3e} > tol {tol:.1e}\n{report}")
    return worst


def _check_one(harness: _Harness, i: int, a: np.ndarray, name: str, mode: str,
               num_directions: int, h: float, floor: float,
               rng: np.random.Generator) -> _Finding:
    if mode == "full":
        numeric = np.zeros_like(a)
        for idx in np.ndindex(*a.shape):
            numeric[idx] = harness.derivative(i, idx, h)
        diff = np.abs(a - numeric)
        if diff.size == 0:
            return _Finding(name, 0.0, "(empty)", 0.0, 0.0)
        scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(numeric))))
        j = np.unravel_index(int(np.argmax(diff)), a.shape)
        err = float(diff[j]) / (scale + floor)
        return _Finding(name, err, f"index {tuple(int(t) for t in j)}", float(a[j]),
                        float(numeric[j]))
    best = _Finding(name, 0.0, "(empty)", 0.0, 0.0)
    norm = float(np.linalg.norm(a))
    for d in range(num_directions if a.size else 0):
        v = rng.standard_normal(a.shape)
        v /= np.linalg.norm(v)
        num, ana = harness.derivative(i, v, h), float(np.sum(a * v))
        err = abs(ana - num) / (norm + floor)
        if err >= best.error:
            best = _Finding(name, err, f"direction {d}", ana, num)
    return best


def _check_args(forward: Any, backward: Any, inputs: Any, rng: Any, wrt: Any, mode: Any,
                num_directions: Any, h: Any, floor: Any, tol: Any, names: Any,
                state: Any) -> tuple[list[Any], list[int] | None, int, float, float]:
    """Every argument of `gradcheck`, checked before forward runs or rng advances."""
    for name, fn in (("forward", forward), ("backward", backward)):
        if not callable(fn):
            raise TypeError(f"{name} must be callable (a {name} function); "
                            f"got {type(fn).__name__}")
    if isinstance(inputs, (np.ndarray, str, bytes)) or not isinstance(inputs, Sequence):
        raise TypeError("inputs must be a tuple or list of forward's arguments (wrap a "
                        f"single array as (x,)); got {type(inputs).__name__}")
    items = list(inputs)
    if not items:
        raise ValueError("inputs is empty: gradcheck needs forward's arguments, at least one "
                         "float array to check (e.g. (x, gamma, beta))")
    check_generator(rng)
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}; got {mode!r}")
    num_directions = check_int(num_directions, "num_directions", minimum=1)
    h, floor = check_positive(h, "h"), check_positive(floor, "floor")
    if tol is not None:
        check_nonneg(tol, "tol")
    indices = None if wrt is None else _check_wrt(wrt, items)
    if names is not None and (isinstance(names, str) or not isinstance(names, Sequence)
                              or len(names) != len(items)):
        raise ValueError(f"names must be a sequence of {len(items)} labels, one per input; "
                         f"got {names!r}"[:200])
    if isinstance(state, np.ndarray) or not isinstance(state, Sequence):
        raise TypeError(f"state must be a sequence of arrays; got {type(state).__name__}")
    for k, arr in enumerate(state):
        check_writeable(arr, f"state[{k}]", "it is restored in place")
    return items, indices, num_directions, h, floor


def _check_wrt(wrt: Any, items: list[Any]) -> list[int]:
    if isinstance(wrt, (str, bytes)) or not isinstance(wrt, Sequence):
        raise TypeError(f"wrt must be a sequence of input indices; got {wrt!r}")
    out = []
    for i in wrt:
        k = check_int(i, "wrt entry", minimum=0)
        if k >= len(items):
            raise ValueError(f"wrt entry must be < {len(items)} (the number of inputs); got {k}")
        if not (isinstance(items[k], np.ndarray) and is_float_dtype(items[k].dtype)):
            raise TypeError(f"wrt: input {k} must be a float array; "
                            f"got {type(items[k]).__name__}")
        out.append(k)
    return out


class _CallableModule(types.ModuleType):
    """This module, callable as its function.

    `normlab.gradcheck(...)` runs `gradcheck`, while `import normlab.gradcheck as m` gives the
    module (with `m.gradcheck`, `m.GradcheckError`), as one name cannot be both otherwise.
    """


    def __call__(self, *args: Any, **kwargs: Any) -> float:
        return gradcheck(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
