"""Loss scaling for low-precision gradients: dynamic (GradScaler rules) and static.

Contract: `scale_loss` multiplies the loss by the scale; after backward, `unscale`
checks the *scaled* gradients for inf/NaN and multiplies them in place by the reciprocal
of the scale; `update` adjusts the scale once per optimizer step. The optimizer step must
be skipped when `unscale` reported an overflow (see `normlab.precision.training.mixed_step`).

With its defaults [DynamicLossScaler][normlab.precision.DynamicLossScaler] follows
`torch.amp.GradScaler` exactly:

- the scale is a float32 number; the unscale factor is `float32(1 / float64(scale))`
  and is applied as a multiplication (float32 arithmetic for float32 and narrower
  gradients, float64 for float64 gradients), skipped when it equals 1;
- `update(found_inf)`: an overflow multiplies the scale once by `backoff_factor`
  (product taken in float64, rounded to float32) and zeroes the growth tracker; a clean
  step increments the tracker, and when it reaches `growth_interval` the candidate
  `float32(scale * growth_factor)` is accepted only if finite, and the tracker is
  zeroed whether or not it was accepted.

Micikevicius et al., "Mixed Precision Training", ICLR 2018 (loss scaling).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from normlab._validate import check_int, scalar_item
from normlab.precision.training._scaler_ops import (
    as_f32_scale,
    check_found_inf,
    check_growth,
    check_min_scale,
    check_state_keys,
    collect_grads,
    found_inf,
    inv,
    multiply_in_place,
    scale_loss,
)

__all__ = ["DynamicLossScaler", "StaticLossScaler"]

# GradScaler.state_dict()'s keys; the rest are normlab's extensions.
_TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_EXTRA_KEYS = ("hysteresis", "_hysteresis_tracker", "min_scale")


class _LossScaler:
    """Shared by both scalers: the scale, loss scaling, unscale and the recorded overflow."""

    _scale: float
    _pending: bool | None = None  # OR of unscale results since the last update

    @property
    def scale(self) -> float:
        """The current scale (a float32 value, returned as a Python float)."""
        return self._scale

    def get_scale(self) -> float:
        """The current scale (GradScaler's spelling)."""
        return self._scale

    @property
    def inv_scale(self) -> float:
        """float32(1 / float64(scale)): the factor `unscale` multiplies by."""
        return inv(self._scale)

    def scale_loss(self, loss: Any) -> Any:
        """`loss * scale` in float32 arithmetic (float64 for float64), in loss's dtype."""
        return scale_loss(loss, self._scale)

    def unscale(self, grads: Any) -> bool:
        """Check the scaled gradients for inf/NaN, then multiply them in place by inv_scale.

        Every array is multiplied, even on overflow (the step is skipped anyway). The result
        is also recorded for an `update()` called without `found_inf`.

        Parameters
        ----------
        grads : numpy.ndarray, sequence or mapping
            An ndarray, a sequence of ndarrays (`None` entries skipped) or a mapping whose
            values are those; multiplied in place.

        Returns
        -------
        bool
            True when any value was inf or NaN.
        """
        arrays = collect_grads(grads)
        found = found_inf(arrays)
        multiply_in_place(arrays, self.inv_scale)
        self._pending = found or bool(self._pending)
        return found

    def _take_found_inf(self, found_inf: Any) -> bool:
        if found_inf is None:
            if self._pending is None:
                raise ValueError(
                    "update() needs found_inf, or a call to unscale() since the last update"
                )
            overflow = self._pending
        else:
            overflow = check_found_inf(found_inf)
        self._pending = None
        return overflow


class DynamicLossScaler(_LossScaler):
    """Dynamic loss scaling with `torch.amp.GradScaler`'s update rules.

    `scale <- scale * backoff_factor` on an overflowing step (skip the optimizer step),
    `scale <- scale * growth_factor` after `growth_interval` consecutive clean steps.
    Micikevicius et al. 2018; hysteresis as in Megatron-LM's `DynamicGradScaler`.

    Parameters
    ----------
    init_scale : float
        The starting scale, held as float32 (must stay finite and > 0 there).
    growth_factor : float
        The scale is multiplied by it (> 1) after `growth_interval` clean steps.
    backoff_factor : float
        The scale is multiplied by it (in (0, 1)) on an overflow.
    growth_interval : int
        The number (>= 1) of consecutive clean steps before the scale grows.
    hysteresis : int
        Overflows before a backoff, >= 1 (default 1: GradScaler's behaviour). A counter
        starts at `hysteresis`; every overflowing update zeroes the growth tracker and
        decrements the counter, and the scale backs off only when the counter is <= 0.
        The counter is restored to `hysteresis` when the scale grows (the growth tracker
        reaching `growth_interval`), not by a single clean step: so the first backoff comes
        on the `hysteresis`-th overflow since the start or the last growth, and from then on
        every overflow backs off until the next growth. This is Megatron-LM's
        `DynamicGradScaler` code (its docstring says "consecutive", but a clean step does
        not restore the counter); apex/NeMo's fused hysteresis kernel restores it on every
        clean step instead. Growth keeps GradScaler's finite-in-float32 check.
    min_scale : float, optional
        A floor, 0 < min_scale <= init_scale: a backoff never takes the scale below
        `float32(min_scale)` (None: no floor, as in GradScaler).

    Attributes
    ----------
    growth_factor, backoff_factor, growth_interval, hysteresis, min_scale
        The settings, as given (`min_scale` rounded to float32).

    Raises
    ------
    ValueError, TypeError
        On bad parameters; nothing is created.

    Examples
    --------
    >>> s = DynamicLossScaler(init_scale=8.0, growth_interval=2)
    >>> s.update(True); s.scale
    4.0
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        *,
        hysteresis: int = 1,
        min_scale: float | None = None,
    ) -> None:
        scale = as_f32_scale(init_scale, "init_scale")
        gf, bf, gi = check_growth(growth_factor, backoff_factor, growth_interval, "")
        hy = check_int(hysteresis, "hysteresis", minimum=1)
        ms = check_min_scale(min_scale, scale, "min_scale", "init_scale")
        self._scale = scale
        self.growth_factor, self.backoff_factor, self.growth_interval = gf, bf, gi
        self.hysteresis, self.min_scale = hy, ms
        self._growth_tracker = 0
        self._hysteresis_tracker = hy

    def update(self, found_inf: Any = None, *, new_scale: Any = None) -> None:
        """Adjust the scale after one optimizer step (one backoff at most per call).

        Parameters
        ----------
        found_inf : bool, optional
            A bool, 0 or 1 (or a 1-element array of one); None uses what `unscale` found
            since the last update (GradScaler's `update()`).
        new_scale : float, optional
            GradScaler's `update(new_scale)`: a number or a 1-element float array that
            becomes the scale (rounded to float32); the growth and hysteresis trackers are
            kept and what `unscale` recorded is dropped, as in torch. It must be finite, >= 0
            and not below `min_scale`; it cannot be combined with `found_inf`. Keyword-only,
            because `update(x)` passes a found_inf flag here.

        Examples
        --------
        >>> s = DynamicLossScaler(8.0); s.update(new_scale=np.array([2.0**10])); s.scale
        1024.0
        """
        if new_scale is not None:
            if found_inf is not None:
                raise ValueError(
                    "pass found_inf or new_scale, not both (GradScaler.update(new_scale) "
                    f"sets the scale and ignores overflows); got found_inf={found_inf!r}"
                )
            scale = as_f32_scale(new_scale, "new_scale", allow_zero=True, allow_one_element=True)
            check_min_scale(self.min_scale, scale, "min_scale", "new_scale")
            self._scale, self._pending = scale, None
            return
        overflow = self._take_found_inf(found_inf)
        if overflow:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                new = float(np.float32(self._scale * self.backoff_factor))  # float64 product
                if self.min_scale is not None:
                    new = max(new, self.min_scale)
                self._scale = new
            return
        successful = self._growth_tracker + 1
        if successful == self.growth_interval:
            with np.errstate(over="ignore"):
                candidate = np.float32(self._scale * self.growth_factor)
            if np.isfinite(candidate):  # never grow past float32's range
                self._scale = float(candidate)
            self._growth_tracker = 0
            self._hysteresis_tracker = self.hysteresis
        else:
            self._growth_tracker = successful

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state: GradScaler's keys plus normlab's.

        GradScaler's keys (scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker) plus hysteresis, _hysteresis_tracker and (when set) min_scale.
        Python scalars only, so `np.savez(f, **scaler.state_dict())` works.
        """
        state: dict[str, Any] = {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
            "hysteresis": self.hysteresis,
            "_hysteresis_tracker": self._hysteresis_tracker,
        }
        if self.min_scale is not None:
            state["min_scale"] = self.min_scale
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict` or from `torch.amp.GradScaler.state_dict()`.

        Values may be Python scalars or 0-d arrays (`np.load`). A scale of 0.0 (reached
        by backoff underflow) is accepted, as torch does. A GradScaler dict (no
        `hysteresis` key) keeps this scaler's hysteresis and min_scale settings and
        restores the hysteresis counter to full; in a normlab dict a missing min_scale
        means no floor. Everything is validated (min_scale <= scale, tracker <
        growth_interval, ...) before anything is assigned, so a rejected state changes
        nothing.

        Raises
        ------
        TypeError, ValueError
            Naming the offending key.
        """
        check_state_keys(state, _TORCH_KEYS, _TORCH_KEYS + _EXTRA_KEYS, "DynamicLossScaler")
        scale = as_f32_scale(state["scale"], "state['scale']", allow_zero=True)
        gf, bf, gi = check_growth(state["growth_factor"], state["backoff_factor"],
                                   state["growth_interval"], "state")
        tracker = check_int(scalar_item(state["_growth_tracker"], "state['_growth_tracker']"),
                            "state['_growth_tracker']", minimum=0)
        if tracker >= gi:
            raise ValueError(
                f"state['_growth_tracker'] must be < growth_interval ({gi}); got {tracker}"
            )
        ours = "hysteresis" in state
        hy = check_int(scalar_item(state.get("hysteresis", self.hysteresis),
                                   "state['hysteresis']"), "state['hysteresis']", minimum=1)
        h_tracker = check_int(scalar_item(state.get("_hysteresis_tracker", hy),
                                          "state['_hysteresis_tracker']"),
                              "state['_hysteresis_tracker']")
        if h_tracker > hy:
            raise ValueError(
                f"state['_hysteresis_tracker'] must be <= hysteresis ({hy}); got {h_tracker}"
            )
        ms_name = "state['min_scale']" if "min_scale" in state else "min_scale (kept)"
        ms_in = state.get("min_scale", None if ours else self.min_scale)
        ms = check_min_scale(ms_in, scale, ms_name, "state['scale']")
        self._scale, self.growth_factor, self.backoff_factor = scale, gf, bf
        self.growth_interval, self.hysteresis, self.min_scale = gi, hy, ms
        self._growth_tracker, self._hysteresis_tracker = tracker, h_tracker
        self._pending = None

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self._scale!r}, growth_factor={self.growth_factor!r}, "
            f"backoff_factor={self.backoff_factor!r}, growth_interval={self.growth_interval}, "
            f"hysteresis={self.hysteresis}, min_scale={self.min_scale!r})"
        )


class StaticLossScaler(_LossScaler):
    """A fixed loss scale: same interface as `DynamicLossScaler`, `update` is a no-op.

    `unscale` still reports inf/NaN so the caller can skip the step.

    Parameters
    ----------
    scale : float
        The scale, held as float32 (finite and > 0 there).

    Examples
    --------
    >>> StaticLossScaler(128.0).scale_loss(0.5)
    64.0
    """

    def __init__(self, scale: float = 1.0) -> None:
        self._scale = as_f32_scale(scale, "scale")

    def update(self, found_inf: Any = None) -> None:
        """Validates `found_inf` and changes nothing (the scale is static)."""
        self._take_found_inf(found_inf)

    def state_dict(self) -> dict[str, Any]:
        """`{"scale": scale}`."""
        return {"scale": self._scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scale from `state_dict` (a Python float or a 0-d array).

        A dynamic scaler's state (GradScaler keys) is refused: load it into
        [DynamicLossScaler][normlab.precision.DynamicLossScaler]. Nothing changes on error.
        """
        check_state_keys(state, ("scale",), ("scale",), "StaticLossScaler")
        self._scale = as_f32_scale(state["scale"], "state['scale']")
        self._pending = None

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self._scale!r})"
