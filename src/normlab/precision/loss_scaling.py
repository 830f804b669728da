"""Loss scaling for low-precision gradients: dynamic (GradScaler rules) and static.

Contract: ``scale_loss`` multiplies the loss by the scale; after backward, ``unscale``
checks the *scaled* gradients for inf/NaN and multiplies them in place by the reciprocal
of the scale; ``update`` adjusts the scale once per optimizer step. The optimizer step must
be skipped when ``unscale`` reported an overflow (see :mod:`normlab.precision.mixed`).

With its defaults :class:`DynamicLossScaler` follows ``torch.amp.GradScaler`` exactly:

- the scale is a float32 number; the unscale factor is ``float32(1 / float64(scale))``
  and is applied as a multiplication (float32 arithmetic for float32 and narrower
  gradients, float64 for float64 gradients), skipped when it equals 1;
- ``update(found_inf)``: an overflow multiplies the scale once by ``backoff_factor``
  (product taken in float64, rounded to float32) and zeroes the growth tracker; a clean
  step increments the tracker, and when it reaches ``growth_interval`` the candidate
  ``float32(scale * growth_factor)`` is accepted only if finite, and the tracker is
  zeroed whether or not it was accepted.

Micikevicius et al., "Mixed Precision Training", ICLR 2018 (loss scaling).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real, check_int

__all__ = ["DynamicLossScaler", "StaticLossScaler"]

_F32_MAX = float(np.finfo(np.float32).max)


def _as_f32_scale(value: Any, name: str) -> float:
    """A finite scale > 0 that stays finite and non-zero once rounded to float32."""
    v = check_finite_real(value, name)
    if v <= 0.0:
        raise ValueError(f"{name} must be > 0; got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        f = float(np.float32(v))
    if not math.isfinite(f) or f == 0.0:
        raise ValueError(
            f"{name} must be representable as a finite, non-zero float32 "
            f"(between about 1.4e-45 and 3.4e38); got {value!r}"
        )
    return f


def _inv(scale: float) -> float:
    """float32(1 / float64(scale)); a scale that underflowed to 0 gives inf (as in torch)."""
    if scale == 0.0:
        return math.inf
    with np.errstate(over="ignore"):
        return float(np.float32(1.0 / scale))


def _collect_grads(grads: Any) -> list[np.ndarray]:
    """The gradient arrays to unscale in place; ``None`` entries (no gradient) are skipped."""
    items = [grads] if isinstance(grads, np.ndarray) else grads
    if isinstance(items, Mapping):
        items = list(items.values())
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise TypeError(
            f"grads must be an ndarray or a sequence of ndarrays; got {type(grads).__name__}"
        )
    out: list[np.ndarray] = []
    for i, g in enumerate(items):
        if g is None:
            continue
        if not isinstance(g, np.ndarray):
            raise TypeError(
                f"grads[{i}] must be a numpy ndarray (it is unscaled in place); "
                f"got {type(g).__name__}"
            )
        as_float_array(g, f"grads[{i}]")
        if not g.flags.writeable:
            raise ValueError(f"grads[{i}] must be writeable (it is unscaled in place)")
        out.append(g)
    return out


def _found_inf(arrays: list[np.ndarray]) -> bool:
    # Checked on the scaled values, before the multiplication (GradScaler's order).
    return any(not bool(np.isfinite(g).all()) for g in arrays)


def _multiply_in_place(arrays: list[np.ndarray], inv_scale: float) -> None:
    """g <- g * inv_scale in float32 arithmetic (float64 for float64 arrays)."""
    if inv_scale == 1.0:  # GradScaler leaves the values untouched in this case
        return
    with np.errstate(over="ignore", invalid="ignore"):
        for g in arrays:
            if g.dtype == np.float64:
                g *= np.float64(inv_scale)
            elif g.dtype == np.float32:
                g *= np.float32(inv_scale)
            else:  # float16, bfloat16, fp8: widen, multiply in float32, round back
                g[...] = (g.astype(np.float32) * np.float32(inv_scale)).astype(g.dtype)


def _check_found_inf(found_inf: Any) -> bool:
    if isinstance(found_inf, (bool, np.bool_)):
        return bool(found_inf)
    if isinstance(found_inf, np.ndarray) and found_inf.size == 1:
        found_inf = found_inf.reshape(()).item()
    v = check_finite_real(found_inf, "found_inf")
    return v != 0.0


def _scale_loss(loss: Any, scale: float) -> Any:
    """loss * scale, computed in float32 (float64 for float64 losses), in loss's dtype."""
    if isinstance(loss, (bool, np.bool_)):
        raise TypeError(f"loss must be a real floating value; got {loss!r}")
    if isinstance(loss, (int, float)):
        return float(loss) * scale
    arr = as_float_array(loss, "loss")
    work = np.dtype(np.float64 if arr.dtype == np.float64 else np.float32)
    wide: np.ndarray = arr.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (wide * work.type(scale)).astype(arr.dtype)
    return out if isinstance(loss, np.ndarray) and loss.ndim > 0 else out[()]


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
        """float32(1 / float64(scale)): the factor ``unscale`` multiplies by."""
        return _inv(self._scale)

    def scale_loss(self, loss: Any) -> Any:
        """``loss * scale`` in float32 arithmetic (float64 for float64), in loss's dtype."""
        return _scale_loss(loss, self._scale)

    def unscale(self, grads: Any) -> bool:
        """Check the scaled gradients for inf/NaN, then multiply them in place by inv_scale.

        ``grads``: an ndarray, a sequence of ndarrays (``None`` entries skipped) or a
        mapping whose values are those. Every array is multiplied, even on overflow (the
        step is skipped anyway). Returns True when any value was inf or NaN; the result is
        also recorded for an ``update()`` called without ``found_inf``.
        """
        arrays = _collect_grads(grads)
        found = _found_inf(arrays)
        _multiply_in_place(arrays, self.inv_scale)
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
            overflow = _check_found_inf(found_inf)
        self._pending = None
        return overflow


class DynamicLossScaler(_LossScaler):
    """Dynamic loss scaling with ``torch.amp.GradScaler``'s update rules.

    ``scale <- scale * backoff_factor`` on an overflowing step (skip the optimizer step),
    ``scale <- scale * growth_factor`` after ``growth_interval`` consecutive clean steps.
    Micikevicius et al. 2018; hysteresis as in Megatron-LM's ``DynamicGradScaler``.

    Parameters
    ----------
    init_scale: the starting scale, held as float32 (must stay finite and > 0 there).
    growth_factor: > 1. backoff_factor: in (0, 1). growth_interval: integer >= 1.
    hysteresis: integer >= 1 (default 1: GradScaler's behaviour). A counter starts at
        ``hysteresis``; every overflowing update zeroes the growth tracker and decrements
        the counter, and the scale backs off only when the counter is <= 0. The counter is
        restored to ``hysteresis`` when the scale grows (the growth tracker reaching
        ``growth_interval``), not by a single clean step: so the first backoff comes on
        the ``hysteresis``-th overflow since the start or the last growth, and from then on
        every overflow backs off until the next growth. This is Megatron-LM's
        ``DynamicGradScaler`` code (its docstring says "consecutive", but a clean step does
        not restore the counter); apex/NeMo's fused hysteresis kernel restores it on every
        clean step instead. Growth keeps GradScaler's finite-in-float32 check.
    min_scale: optional floor, 0 < min_scale <= init_scale: a backoff never takes the
        scale below ``float32(min_scale)`` (None: no floor, as in GradScaler).

    Raises
    ------
    ValueError / TypeError on bad parameters; nothing is created.

    Example
    -------
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
        scale, gf, bf, gi, hy, ms = self._check_params(
            init_scale, growth_factor, backoff_factor, growth_interval, hysteresis, min_scale
        )
        self._scale = scale
        self.growth_factor, self.backoff_factor, self.growth_interval = gf, bf, gi
        self.hysteresis, self.min_scale = hy, ms
        self._growth_tracker = 0
        self._hysteresis_tracker = hy

    @staticmethod
    def _check_params(
        scale: Any, gf: Any, bf: Any, gi: Any, hy: Any, ms: Any, scale_name: str = "init_scale"
    ) -> tuple[float, float, float, int, int, float | None]:
        s = _as_f32_scale(scale, scale_name)
        g = check_finite_real(gf, "growth_factor")
        if g <= 1.0:
            raise ValueError(f"growth_factor must be > 1 (it grows the scale); got {gf!r}")
        b = check_finite_real(bf, "backoff_factor")
        if not 0.0 < b < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1) (it shrinks the scale); got {bf!r}")
        interval = check_int(gi, "growth_interval", minimum=1)
        h = check_int(hy, "hysteresis", minimum=1)
        m = None
        if ms is not None:
            m = _as_f32_scale(ms, "min_scale")
            if m > s:
                raise ValueError(f"min_scale must be <= {scale_name} ({s}); got {ms!r}")
        return s, g, b, interval, h, m

    def update(self, found_inf: Any = None) -> None:
        """Adjust the scale after one optimizer step (one backoff at most per call).

        ``found_inf``: bool or number (non-zero = overflow); None uses what ``unscale``
        found since the last update (GradScaler's ``update()``).
        """
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
        """GradScaler's keys (scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker) plus hysteresis, _hysteresis_tracker and min_scale."""
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
            "hysteresis": self.hysteresis,
            "_hysteresis_tracker": self._hysteresis_tracker,
            "min_scale": self.min_scale,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` or from a GradScaler state dict.

        Missing hysteresis keys keep the current settings (tracker restored to full);
        everything is validated before anything is assigned.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping; got {type(state).__name__}")
        required = ("scale", "growth_factor", "backoff_factor", "growth_interval")
        missing = [k for k in (*required, "_growth_tracker") if k not in state]
        if missing:
            raise ValueError(f"state is missing keys {missing}; it has {sorted(state)}")
        hy_in = state.get("hysteresis", self.hysteresis)
        ms_in = state.get("min_scale", self.min_scale if "hysteresis" not in state else None)
        scale, gf, bf, gi, hy, ms = self._check_params(
            state["scale"], state["growth_factor"], state["backoff_factor"],
            state["growth_interval"], hy_in, None, scale_name="state['scale']",
        )
        if ms_in is not None:
            ms = _as_f32_scale(ms_in, "state['min_scale']")
        tracker = check_int(state["_growth_tracker"], "state['_growth_tracker']", minimum=0)
        if tracker >= gi:
            raise ValueError(
                f"state['_growth_tracker'] must be < growth_interval ({gi}); got {tracker}"
            )
        h_tracker = check_int(state.get("_hysteresis_tracker", hy), "state['_hysteresis_tracker']")
        self._scale, self.growth_factor, self.backoff_factor = scale, gf, bf
        self.growth_interval, self.hysteresis, self.min_scale = gi, hy, ms
        self._growth_tracker, self._hysteresis_tracker = tracker, min(h_tracker, hy)

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self._scale!r}, growth_factor={self.growth_factor!r}, "
            f"backoff_factor={self.backoff_factor!r}, growth_interval={self.growth_interval}, "
            f"hysteresis={self.hysteresis}, min_scale={self.min_scale!r})"
        )


class StaticLossScaler(_LossScaler):
    """A fixed loss scale: same interface as :class:`DynamicLossScaler`, ``update`` is a no-op.

    ``unscale`` still reports inf/NaN so the caller can skip the step.

    Example
    -------
    >>> StaticLossScaler(128.0).scale_loss(0.5)
    64.0
    """

    def __init__(self, scale: float = 1.0) -> None:
        self._scale = _as_f32_scale(scale, "scale")

    def update(self, found_inf: Any = None) -> None:
        """Validates ``found_inf`` and changes nothing (the scale is static)."""
        self._take_found_inf(found_inf)

    def state_dict(self) -> dict[str, Any]:
        """``{"scale": scale}``."""
        return {"scale": self._scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scale from :meth:`state_dict`."""
        if not isinstance(state, Mapping) or "scale" not in state:
            raise ValueError(f"state must be a mapping with key 'scale'; got {state!r}"[:200])
        self._scale = _as_f32_scale(state["scale"], "state['scale']")

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self._scale!r})"
