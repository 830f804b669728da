"""Per-tensor FP8 scaling on tensors: current scaling and delayed-scaling state (``Fp8Meta``).

Dimension letters: L amax history length.

Contract: the NumPy recipes of :mod:`normlab.precision.fp8_scaling` and
:mod:`normlab.precision._delayed_update`, bit for bit, with every scalar kept as a 0-d
tensor on the data's device (no host synchronisation): ``data = sat_round(x * scale)``
(x * scale in float64 for float64 input, else float32), ``scale_inv = float32(1 /
scale)``; current scaling ``a = max(amax(x), amax_epsilon)``, ``scale = (fp8_max *
2^-margin) / a`` in float32 (1 when a is 0, inf or NaN; inf -> FLT_MAX; below 2^-127 ->
2^-127; ``power_of_2_scales`` clears the mantissa); delayed scaling keeps an amax history
(L,) and a scale, records amax into slot 0 as a running max, and updates with TE's fused
(default) or unfused rule. The constant ``fp8_max * 2^-margin`` is formed on the host in
float32 exactly as NumPy does; every other operation is an IEEE float32/float64 tensor op,
correctly rounded on every device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._validate import check_finite_real, check_int
from normlab.precision.formats import Format
from normlab.precision.fp8_scaling import DelayedScaling
from normlab.precision.fp8_scaling import _checked_state as _np_checked_state
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.quantize import _check_tensor, quantize

__all__ = ["Fp8Meta", "Fp8Tensor", "fp8_quantize", "quantize_current_scaling"]

_F32_MAX = float(np.finfo(np.float32).max)
_MIN_SCALE = 2.0**-127


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 tensor: ``data`` (float32 values of ``fmt``), 0-d ``scale``, ``scale_inv``
    (float32) and ``amax`` (float64) tensors on data's device."""

    data: torch.Tensor
    scale: torch.Tensor
    scale_inv: torch.Tensor
    fmt: Format
    amax: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """``data * scale_inv`` in float32."""
        return self.data * self.scale_inv


def _amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a 0-d float64 tensor (NaN if t holds one; 0 when empty)."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=t.device)
    return t.detach().abs().amax().to(torch.float64)  # NaN propagates


def _scale_tensor(scale: Any, device: torch.device) -> torch.Tensor:
    """A float32 0-d scale; Python numbers are validated (finite, > 0) on the host."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise TypeError(f"scale must be a float or a one-element float tensor; got "
                            f"{scale.dtype} of shape {tuple(scale.shape)}")
        return scale.detach().reshape(()).to(device=device, dtype=torch.float32)
    s = float(np.float32(check_finite_real(scale, "scale")))
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite float32 > 0; got {scale!r}")
    return torch.tensor(s, dtype=torch.float32, device=device)


def _reciprocal(s: torch.Tensor) -> torch.Tensor:
    return torch.div(torch.ones_like(s), s)  # IEEE division, float32


def fp8_quantize(t: torch.Tensor, fmt: Any, scale: Any) -> Fp8Tensor:
    """``sat_round(t * scale)`` with t * scale in float32 (float64 input: float64).

    Parameters
    ----------
    t : Tensor of float32/float64/bfloat16/float16
    fmt : Format, name or torch dtype
    scale : float (checked: finite float32 > 0) or one-element tensor (taken as is)

    Returns
    -------
    Fp8Tensor, equal to :func:`normlab.precision.fp8_quantize` on ``t.cpu().numpy()``.

    Example
    -------
    >>> fp8_quantize(torch.tensor([1.0, 1000.0]), "e4m3", 1.0).data.tolist()
    [1.0, 448.0]
    """
    t = _check_tensor(t)
    f = get_format(fmt)
    s = _scale_tensor(scale, t.device)
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    scaled = t.detach().to(work) * s.to(work)
    data = quantize(scaled, f, saturate=True).to(torch.float32)
    return Fp8Tensor(data, s, _reciprocal(s), f, _amax(t))


def _finish(s: torch.Tensor) -> torch.Tensor:
    """inf -> FLT_MAX; below 2^-127 -> 2^-127 (as the NumPy update)."""
    s = torch.where(torch.isinf(s), _F32_MAX, s)
    return torch.clamp(s, min=_MIN_SCALE)


def _scale_from_amax(amax: torch.Tensor, previous: torch.Tensor, fp8_max: float,
                     margin: int, update: str) -> torch.Tensor:
    """The float32 scale from a 0-d amax; ``previous`` for amax 0, inf or NaN."""
    a = amax.to(torch.float32)
    ok = torch.isfinite(a) & (a > 0)
    safe = torch.where(ok, a, 1.0)
    if update == "fused":
        with np.errstate(over="ignore", under="ignore"):
            scaled_max = float(np.float32(np.ldexp(np.float32(fp8_max), -margin)))
        s = torch.tensor(scaled_max, dtype=torch.float32, device=a.device) / safe
    else:  # float32(fp8_max * float32(1 / a)), then an exact float64 ldexp, rounded once
        q = torch.tensor(fp8_max, dtype=torch.float32, device=a.device) * _reciprocal(safe)
        s = (q.to(torch.float64) * 2.0 ** -max(min(margin, 1000), -1000)).to(torch.float32)
    return torch.where(ok, _finish(s), previous.to(torch.float32))


def quantize_current_scaling(t: torch.Tensor, fmt: Any = "e4m3", *, margin: int = 0,
                             amax_epsilon: float = 0.0,
                             power_of_2_scales: bool = False) -> Fp8Tensor:
    """Per-tensor current scaling: the scale comes from this tensor's own amax.

    ``a = max(amax(t), amax_epsilon)``, ``scale = (fp8_max * 2^-margin) / a`` (1 when a is
    0, inf or NaN), rounded down to a power of two with ``power_of_2_scales``
    (Transformer Engine ``Float8CurrentScaling``; NumPy twin
    :func:`normlab.precision.quantize_current_scaling`, equal bit for bit).

    Raises
    ------
    TypeError, ValueError
        As the NumPy twin (bad tensor, margin, amax_epsilon < 0, non-bool power flag).

    Example
    -------
    >>> q = quantize_current_scaling(torch.tensor([0.5, -2.0]), "e4m3")
    >>> q.scale.item(), q.data.tolist()
    (224.0, [112.0, -448.0])
    """
    t = _check_tensor(t)
    f = get_format(fmt)
    m = check_int(margin, "margin")
    eps = check_finite_real(amax_epsilon, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {amax_epsilon!r}")
    if not isinstance(power_of_2_scales, bool):
        raise TypeError(f"power_of_2_scales must be a bool; got {power_of_2_scales!r}")
    a = _amax(t)
    a = torch.where(a < eps, eps, a)  # NaN stays NaN (NaN < eps is False), as in TE
    one = torch.ones((), dtype=torch.float32, device=t.device)
    scale = _scale_from_amax(a, one, f.max, m, "fused")
    if power_of_2_scales:  # clear the float32 mantissa bits
        scale = (scale.view(torch.int32) & -(2**23)).view(torch.float32)
    return fp8_quantize(t, f, scale)


@dataclass
class Fp8Meta:
    """Delayed-scaling state of one tensor on a device: amax history (L,), scale, scale_inv.

    The NumPy :class:`normlab.precision.Fp8Meta` with tensors: the same recipe
    (:class:`normlab.precision.DelayedScaling`), the same quantize / update rules, equal
    bit for bit; nothing leaves the device.

    Example
    -------
    >>> from normlab.precision import DelayedScaling
    >>> meta = Fp8Meta(DelayedScaling(amax_history_len=2))
    >>> meta.quantize(torch.tensor([2.0])).data.tolist(); meta.update(); meta.scale.item()
    [2.0]
    224.0
    """

    recipe: DelayedScaling
    role: str = "forward"
    device: Any = None
    amax_history: torch.Tensor = field(init=False)
    scale: torch.Tensor = field(init=False)
    scale_inv: torch.Tensor = field(init=False)
    fmt: Format = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, DelayedScaling):
            raise TypeError(f"recipe must be a DelayedScaling; got {type(self.recipe).__name__}")
        self.fmt = self.recipe.format_for(self.role)
        dev = torch.device("cpu") if self.device is None else torch.device(self.device)
        self.amax_history = torch.zeros(self.recipe.amax_history_len, dtype=torch.float32,
                                        device=dev)  # L
        self.scale = torch.ones((), dtype=torch.float32, device=dev)
        self.scale_inv = torch.ones((), dtype=torch.float32, device=dev)

    def quantize(self, t: torch.Tensor) -> Fp8Tensor:
        """Quantise with the current scale and record amax(t) into history slot 0."""
        q = fp8_quantize(t, self.fmt, self.scale)
        h0 = self.amax_history[0].to(torch.float64)
        new0 = torch.maximum(h0, q.amax.to(h0.device)).to(torch.float32)  # NaN sticks
        self.amax_history = torch.cat([new0.reshape(1), self.amax_history[1:]])
        return q

    def update(self) -> None:
        """End of step: amax from the history, new scale and scale_inv, then roll."""
        r = self.recipe
        h = self.amax_history  # L
        last = h[0]
        rolled = torch.roll(h, -1)
        rolled = torch.cat([torch.zeros_like(rolled[:1]), rolled[1:]])  # slot 0 <- 0
        if r.update == "fused":
            rolls = last != 0  # NaN != 0: a NaN step rolls
            window = torch.where(torch.isnan(h), 0.0, h).amax().clamp(min=0.0)
            amax = torch.where(rolls, window, 0.0)
            self.amax_history = torch.where(rolls, rolled, h)
        else:
            amax = h.amax()  # NaN propagates (torch.max)
            self.amax_history = rolled
        if r.amax_compute_algo == "most_recent":
            amax = last
        self.scale = _scale_from_amax(amax, self.scale, self.fmt.max, r.margin, r.update)
        self.scale_inv = _reciprocal(self.scale)

    def state_dict(self) -> dict[str, Any]:
        """The state: ``amax_history`` (float32, L), ``scale``, ``scale_inv`` (0-d float32)
        as copies on this meta's device, and ``role``, ``fp8_format``, ``amax_history_len``
        (checked on load). The keys of :meth:`normlab.precision.Fp8Meta.state_dict`.

        Example
        -------
        >>> from normlab.precision import DelayedScaling
        >>> Fp8Meta(DelayedScaling(amax_history_len=2)).state_dict()["scale"]
        tensor(1.)
        """
        return {"amax_history": self.amax_history.clone(), "scale": self.scale.clone(),
                "scale_inv": self.scale_inv.clone(), "role": self.role,
                "fp8_format": self.recipe.fp8_format,
                "amax_history_len": int(self.recipe.amax_history_len)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` or the NumPy twin's (tensors on any device,
        arrays, 0-d arrays from ``np.load`` or floats); values move to this meta's device.

        ``scale_inv`` is recomputed from ``scale``. Everything is validated before anything
        changes: another history length, role or format, a history of the wrong shape or a
        scale that is not a finite float32 > 0 raises ValueError/TypeError and leaves the
        meta as it was.
        """
        history, scale = _checked_state(state, self)
        dev = self.amax_history.device
        self.amax_history = torch.from_numpy(history).to(dev)
        self.scale = torch.tensor(scale, dtype=torch.float32, device=dev)
        self.scale_inv = _reciprocal(self.scale)


def _checked_state(state: Mapping[str, Any], meta: Fp8Meta) -> tuple[np.ndarray, float]:
    """(history float32 (L,), scale): the NumPy twin's checks, with tensors brought to NumPy."""
    if isinstance(state, Mapping):
        state = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
                 for k, v in state.items()}  # fmt: skip
    # the torch meta has the fields the NumPy check reads (role, recipe): duck-typed
    return _np_checked_state(state, meta)  # type: ignore[arg-type]
