"""Mixed-precision training: fp32 master weights, the guarded step, low-precision updates.

Contract: [MasterWeights][normlab.precision.MasterWeights] keeps a float32 master copy of each
parameter and writes `quantize(master, fmt)` into the parameter's `.data` (the working copy the
forward and backward passes use). [mixed_precision_step][normlab.precision.mixed_precision_step]
is the order every mixed-precision loop needs: unscale (and check) the gradients, skip the step
on overflow (only the scaler changes), clip the *unscaled* gradient norm, step the optimizer on
the masters, refresh the working copy.
[LowPrecisionUpdater][normlab.precision.LowPrecisionUpdater] is the comparison without masters:
weights held in the format itself, updated by round-to-nearest, stochastic rounding or Kahan
summation. Both classes live in their own files (`master_weights.py`, `lowp_update.py`) and are
re-exported here.

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
    check_nonneg,
    check_positive,
    check_writeable,
)
from normlab.precision.training.lowp_update import LowPrecisionUpdater
from normlab.precision.training.master_weights import MasterWeights

__all__ = [
    "LowPrecisionUpdater",
    "MasterWeights",
    "StepResult",
    "clip_grad_norm",
    "mixed_precision_step",
]


def clip_grad_norm(grads: Sequence[np.ndarray | None], max_norm: float, *,
                   eps: float = 1e-6) -> float:
    """Scale the gradients in place so that their global L2 norm is at most `max_norm`.

    `total = sqrt(sum ||g||^2)` (in float64), `coef = min(1, max_norm / (total + eps))`,
    `g <- g * coef`: `torch.nn.utils.clip_grad_norm_`'s rule. A non-finite total makes
    the gradients non-finite (they should have been caught by the loss scaler).

    Parameters
    ----------
    grads : sequence of numpy.ndarray or None
        The gradients, scaled in place (None entries are skipped).
    max_norm : float
        The largest global norm, > 0.
    eps : float
        Added to the norm in the divisor, >= 0.

    Returns
    -------
    float
        The total norm before clipping.

    Raises
    ------
    TypeError, ValueError
        max_norm not > 0, eps not >= 0, an entry that is not a writeable float ndarray
        (checked for every entry before any is scaled).
    """
    mx = check_positive(max_norm, "max_norm")
    eps = check_nonneg(eps, "eps")
    if isinstance(grads, np.ndarray) or not isinstance(grads, Iterable):
        raise TypeError(f"grads must be a sequence of ndarrays (or None); got {type(grads)}")
    arrays = [g for g in grads if g is not None]
    for i, g in enumerate(arrays):
        check_writeable(g, f"grads[{i}]", "it is scaled in place")
        as_float_array(g, f"grads[{i}]")
    total = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in arrays))
    coef = min(1.0, mx / (total + eps))
    for g in arrays:
        g *= g.dtype.type(coef)
    return total


@dataclass(frozen=True)
class StepResult:
    """What `mixed_precision_step` did.

    Attributes
    ----------
    skipped : bool
        True when the scaled gradients overflowed and the step was skipped.
    grad_norm : float or None
        The unscaled gradient norm before clipping (None when skipped or not clipped).
    scale : float
        The loss scale after the scaler's update.
    """

    skipped: bool
    grad_norm: float | None
    scale: float


def mixed_precision_step(
    master: MasterWeights, optimizer: Any, scaler: Any, *, max_norm: float | None = None
) -> StepResult:
    """One guarded mixed-precision update after `backward` on a scaled loss.

    1. `found_inf = scaler.unscale(working grads)` (checks the scaled gradients, then
       divides them by the scale in place);
    2. on overflow: `scaler.update(True)` and return, masters, optimizer state and working
       weights untouched;
    3. copy the grads to the float32 masters;
    4. clip their norm (after unscaling, so `max_norm` means the true gradient norm);
    5. `optimizer.step()` (built on `master.masters`);
    6. `scaler.update(False)`;
    7. `master.refresh()`.

    Parameters
    ----------
    master : MasterWeights
        The float32 masters and the working copy
        ([MasterWeights][normlab.precision.MasterWeights]).
    optimizer
        An optimizer built on `master.masters`, e.g. `AdamW(master.masters)`.
    scaler
        A [DynamicLossScaler][normlab.precision.DynamicLossScaler] or
        [StaticLossScaler][normlab.precision.StaticLossScaler].
    max_norm : float, optional
        Clip threshold of the unscaled gradient norm, or None for no clipping.

    Returns
    -------
    StepResult
        Whether the step was skipped, the gradient norm and the new scale.

    Examples
    --------
    >>> from normlab.nn.optim import SGD
    >>> from normlab.precision.training.loss_scaling import DynamicLossScaler
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32), grad=None)
    >>> mw = MasterWeights([p], "fp16"); opt = SGD(mw.masters, lr=0.5)
    >>> p.grad = np.full(2, 1024.0, np.float32)  # gradient of a loss scaled by 1024
    >>> mixed_precision_step(mw, opt, DynamicLossScaler(1024.0)).skipped, p.data.tolist()
    (False, [0.5, 0.5])
    """
    _check_step_args(master, optimizer, scaler, max_norm)
    found_inf = scaler.unscale(master.grads())
    if found_inf:
        scaler.update(True)
        return StepResult(True, None, float(scaler.scale))
    master.copy_grads_to_masters()
    norm = None
    if max_norm is not None:
        norm = clip_grad_norm([m.grad for m in master.masters], max_norm)
    optimizer.step()
    scaler.update(False)
    master.refresh()
    return StepResult(False, norm, float(scaler.scale))


def _check_step_args(master: Any, optimizer: Any, scaler: Any, max_norm: Any) -> None:
    """Everything mixed_precision_step needs, checked before a gradient is unscaled."""
    if not isinstance(master, MasterWeights):
        raise TypeError(f"master must be a MasterWeights; got {type(master).__name__}")
    if not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"optimizer must have a step() method; got {type(optimizer).__name__}")
    for method in ("unscale", "update"):
        if not callable(getattr(scaler, method, None)):
            raise TypeError(f"scaler must have unscale() and update() (a DynamicLossScaler or "
                            f"StaticLossScaler); got {type(scaler).__name__}")
    working = {id(w) for w in master.working}
    if any(id(p) in working for p in getattr(optimizer, "params", ())):
        raise ValueError(
            "optimizer updates the working (rounded) parameters, which refresh() overwrites "
            "from the masters: build it on master.masters, e.g. AdamW(master.masters)"
        )
    if max_norm is not None:
        check_positive(max_norm, "max_norm")
