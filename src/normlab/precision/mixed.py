"""Mixed-precision training: fp32 master weights, the guarded step, low-precision updates.

Contract: :class:`MasterWeights` keeps a float32 master copy of each parameter and writes
``quantize(master, fmt)`` into the parameter's ``.data`` (the working copy the forward and
backward passes use). :func:`mixed_precision_step` is the order every mixed-precision loop
needs: unscale (and check) the gradients, skip the step on overflow (only the scaler
changes), clip the *unscaled* gradient norm, step the optimizer on the masters, refresh the
working copy. :class:`LowPrecisionUpdater` is the comparison without masters: weights held
in the format itself, updated by round-to-nearest, stochastic rounding or Kahan summation.

Micikevicius et al., "Mixed Precision Training", ICLR 2018 (master weights, loss scaling);
Zamirai et al., "Revisiting BFloat16 Training", 2020 (stochastic rounding, Kahan updates).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_finite_real,
    check_generator,
    check_shape,
    optional_grad,
)
from normlab.precision.formats import Format, get_format
from normlab.precision.rounding import quantize

__all__ = [
    "LowPrecisionUpdater",
    "MasterWeights",
    "StepResult",
    "clip_grad_norm",
    "mixed_precision_step",
]

_UPDATE_MODES = ("nearest", "stochastic", "kahan")


class _Master:
    """A float32 master parameter: ``.data`` and ``.grad`` like any optimizer parameter."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.grad: np.ndarray | None = None


class MasterWeights:
    """float32 masters for ``params`` and their working copy rounded to ``fmt``.

    ``working = quantize(master, fmt)``, written into each ``param.data`` (in its own dtype,
    which must hold fmt's values: float32 holds every format up to float32).

    Parameters
    ----------
    params: objects with ``.data`` (float ndarray) and ``.grad``.
    fmt: a :class:`Format` or a name (``"bf16"``, ``"fp16"``, ``"e4m3"``, ...).
    rounding: how the working copy is rounded (``"nearest"`` default, or ``"stochastic"``
        with ``rng``). saturate: passed to ``quantize`` (fp8 without inf: clip to max).

    Example
    -------
    >>> import types
    >>> p = types.SimpleNamespace(data=np.array([1 + 2**-10], np.float32), grad=None)
    >>> mw = MasterWeights([p], "bf16"); p.data.tolist(), mw.params[0].data.tolist()
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
        plist = list(params)
        if not plist:
            raise ValueError("params is empty: there is nothing to keep master weights for")
        for i, p in enumerate(plist):
            if not isinstance(getattr(p, "data", None), np.ndarray) or not hasattr(p, "grad"):
                raise TypeError(f"params[{i}] must have .data (an ndarray) and .grad")
            as_float_array(p.data, f"params[{i}].data")
        if rounding == "stochastic":
            check_generator(rng)
        self.rounding, self.saturate, self.rng = rounding, bool(saturate), rng
        self.working = plist
        self.params = [_Master(p.data.astype(np.float32)) for p in plist]
        self.refresh()

    def refresh(self) -> None:
        """Write ``quantize(master, fmt)`` into every working ``.data`` (before a forward)."""
        for w, m in zip(self.working, self.params, strict=True):
            q = quantize(m.data, self.fmt, rounding=self.rounding, saturate=self.saturate,
                         rng=self.rng)
            w.data[...] = q.astype(w.data.dtype)

    def grads(self) -> list[np.ndarray | None]:
        """The working copy's gradients (what the loss scaler unscales), validated."""
        return [
            optional_grad(w.grad, m.data.shape, f"params[{i}].grad")
            for i, (w, m) in enumerate(zip(self.working, self.params, strict=True))
        ]

    def copy_grads_to_masters(self) -> None:
        """``master.grad = float32(working.grad)`` (None stays None)."""
        for g, m in zip(self.grads(), self.params, strict=True):
            m.grad = None if g is None else g.astype(np.float32)


def clip_grad_norm(grads: Sequence[np.ndarray | None], max_norm: float, *,
                   eps: float = 1e-6) -> float:
    """Scale the gradients in place so that their global L2 norm is at most ``max_norm``.

    ``total = sqrt(sum ||g||^2)`` (in float64), ``coef = min(1, max_norm / (total + eps))``,
    ``g <- g * coef``: ``torch.nn.utils.clip_grad_norm_``'s rule. A non-finite total makes
    the gradients non-finite (they should have been caught by the loss scaler).

    Returns the total norm before clipping.
    """
    mx = check_finite_real(max_norm, "max_norm")
    if mx <= 0:
        raise ValueError(f"max_norm must be > 0; got {max_norm!r}")
    arrays = [g for g in grads if g is not None]
    total = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in arrays))
    coef = min(1.0, mx / (total + eps))
    for g in arrays:
        g *= g.dtype.type(coef)
    return total


@dataclass(frozen=True)
class StepResult:
    """What :func:`mixed_precision_step` did: skipped?, grad norm (unscaled), new scale."""

    skipped: bool
    grad_norm: float | None
    scale: float


def mixed_precision_step(
    master: MasterWeights, optimizer: Any, scaler: Any, *, max_norm: float | None = None
) -> StepResult:
    """One guarded mixed-precision update after ``backward`` on a scaled loss.

    1. ``found_inf = scaler.unscale(working grads)`` (checks the scaled gradients, then
       divides them by the scale in place); 2. on overflow: ``scaler.update(True)`` and
       return, masters, optimizer state and working weights untouched; 3. copy the grads to
       the float32 masters; 4. clip their norm (after unscaling, so ``max_norm`` means the
       true gradient norm); 5. ``optimizer.step()`` (built on ``master.params``);
       6. ``scaler.update(False)``; 7. ``master.refresh()``.

    Parameters
    ----------
    master: the :class:`MasterWeights`. optimizer: e.g. ``AdamW(master.params)``.
    scaler: a Dynamic/StaticLossScaler. max_norm: clip threshold, or None for no clipping.

    Example
    -------
    >>> from normlab.nn.optim import SGD
    >>> from normlab.precision.loss_scaling import DynamicLossScaler
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32), grad=None)
    >>> mw = MasterWeights([p], "fp16"); opt = SGD(mw.params, lr=0.5)
    >>> p.grad = np.full(2, 1024.0, np.float32)  # gradient of a loss scaled by 1024
    >>> mixed_precision_step(mw, opt, DynamicLossScaler(1024.0)).skipped, p.data.tolist()
    (False, [0.5, 0.5])
    """
    if max_norm is not None:
        mx = check_finite_real(max_norm, "max_norm")
        if mx <= 0:
            raise ValueError(f"max_norm must be > 0; got {max_norm!r}")
    found_inf = scaler.unscale(master.grads())
    if found_inf:
        scaler.update(True)
        return StepResult(True, None, float(scaler.scale))
    master.copy_grads_to_masters()
    norm = None
    if max_norm is not None:
        norm = clip_grad_norm([m.grad for m in master.params], max_norm)
    optimizer.step()
    scaler.update(False)
    master.refresh()
    return StepResult(False, norm, float(scaler.scale))


class LowPrecisionUpdater:
    """Update weights stored in ``fmt`` itself (no master copy): ``w <- round(w + delta)``.

    Modes: ``"nearest"`` (ties to even: updates below half an ulp of w are lost),
    ``"stochastic"`` (unbiased: E[round(w + d)] = w + d; needs ``rng``), ``"kahan"``
    (compensated: ``y = d - c; s = w + y; c = (s - w) - y; w = s``, every operation rounded
    to fmt and the compensation ``c`` stored in fmt, one buffer per weight array;
    Zamirai et al. 2020). ``w + delta`` is formed in float64 and rounded once.

    Example
    -------
    >>> w = np.ones(1, np.float32); up = LowPrecisionUpdater("bf16", "kahan")
    >>> for _ in range(8): up.apply(w, np.full(1, 2.0**-10, np.float32))
    >>> w.tolist()  # round-to-nearest would have stayed at 1.0
    [1.0078125]
    """

    def __init__(self, fmt: Format | str, mode: str = "nearest",
                 rng: np.random.Generator | None = None) -> None:
        self.fmt = get_format(fmt)
        if mode not in _UPDATE_MODES:
            raise ValueError(f"mode must be one of {_UPDATE_MODES}; got {mode!r}")
        if mode == "stochastic":
            check_generator(rng)
        self.mode, self.rng = mode, rng
        self._comp: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _q(self, x: np.ndarray, rounding: str = "nearest") -> np.ndarray:
        return quantize(x, self.fmt, rounding=rounding, rng=self.rng)

    def compensation(self, weights: np.ndarray) -> np.ndarray:
        """The Kahan compensation buffer of ``weights`` (zeros before the first update)."""
        entry = self._comp.get(id(weights))
        if entry is None or entry[0] is not weights:
            comp = np.zeros(weights.shape, np.float64)
            self._comp[id(weights)] = (weights, comp)
            return comp
        return entry[1]

    def apply(self, weights: np.ndarray, delta: Any) -> None:
        """``weights <- round(weights + delta)`` in place (weights hold values of fmt)."""
        if not isinstance(weights, np.ndarray):
            raise TypeError(f"weights must be an ndarray (updated in place); got {type(weights)}")
        w = as_float_array(weights, "weights")
        d = as_float_array(delta, "delta")
        check_shape(d, w.shape, "delta", "the shape of weights")
        w64, d64 = w.astype(np.float64), d.astype(np.float64)
        if self.mode == "kahan":
            c = self.compensation(weights)
            y = self._q(d64 - c)
            s = self._q(w64 + y)
            c[...] = self._q(self._q(s - w64) - y)
            new = s
        else:
            new = self._q(w64 + d64, self.mode)
        weights[...] = new.astype(weights.dtype)
