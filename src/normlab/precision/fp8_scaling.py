"""Per-tensor FP8 scaling: current scaling and Transformer Engine's delayed scaling.

Contract: an FP8 tensor is ``data = sat_round(x * scale)`` (values of E4M3 or E5M2, held in
float32) plus ``scale_inv = float32(1 / scale)``; ``dequantize() = data * scale_inv``.
Overflow saturates to +-max (Transformer Engine casts with saturation); NaN stays NaN.

Scale rule (shared by both recipes, in float32): ``scale = fp8_max / amax / 2^margin``;
if amax is zero, inf or NaN the previous scale is kept (1.0 for current scaling); a scale
that overflows float32 becomes float32's max.

Delayed scaling (Transformer Engine ``DelayedScaling``; Micikevicius et al., "FP8 Formats
for Deep Learning", 2022): each tensor keeps an amax history of length L, zero at the
start, and a scale (1.0 at the start). ``quantize`` uses the *current* scale and records
the tensor's amax into slot 0 (as a running max if the tensor is quantised several times
in a step). ``update`` (once per step, after backward) reads amax = max over the whole
history (``"max"``) or slot 0 (``"most_recent"``), computes the new scale from it, then
rolls the history one place towards the front (slot i <- slot i+1, slot L-1 <- the old
slot 0) and zeroes slot 0. The window is therefore the last L recorded amaxes, current
step included. HYBRID: E4M3 for forward tensors, E5M2 for gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int
from normlab.precision.formats import FLOAT8_E4M3FN, FLOAT8_E5M2, Format, get_format
from normlab.precision.rounding import quantize

__all__ = [
    "DelayedScaling",
    "Fp8Meta",
    "Fp8Tensor",
    "compute_scale",
    "fp8_quantize",
    "quantize_current_scaling",
]

_F32_MAX = float(np.finfo(np.float32).max)
_FORMATS = ("HYBRID", "E4M3", "E5M2")
_ALGOS = ("max", "most_recent")
_ROLES = ("forward", "backward")


def compute_scale(amax: float, fp8_max: float, margin: int = 0, previous: float = 1.0) -> float:
    """``float32(fp8_max / amax / 2^margin)``; keep ``previous`` if amax is 0, inf or NaN.

    Example
    -------
    >>> compute_scale(3.5, 448.0), compute_scale(0.0, 448.0, previous=2.0)
    (128.0, 2.0)
    """
    a = np.float32(amax)
    if not (np.isfinite(a) and a > 0):
        return float(previous)
    with np.errstate(over="ignore", under="ignore"):
        s = np.ldexp(np.float32(fp8_max) / a, -int(margin)).astype(np.float32)  # / 2^margin
    return _F32_MAX if np.isinf(s) else float(s)


def _amax(x: np.ndarray) -> float:
    """max |x| (NaN if x holds a NaN; 0 for an empty array)."""
    if x.size == 0:
        return 0.0
    return float(np.max(np.abs(x.astype(np.float64))))


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 tensor: ``data`` (float32 values of ``fmt``), ``scale``, ``scale_inv``, ``amax``."""

    data: np.ndarray
    scale: float
    scale_inv: float
    fmt: Format
    amax: float

    def dequantize(self) -> np.ndarray:
        """``data * scale_inv`` in float32."""
        return self.data * np.float32(self.scale_inv)


def fp8_quantize(x: Any, fmt: Format | str, scale: float) -> Fp8Tensor:
    """``sat_round(x * scale)`` with x * scale formed in float32 (float64 input: float64).

    Example
    -------
    >>> fp8_quantize(np.array([1.0, 1000.0], np.float32), "e4m3", 1.0).data.tolist()
    [1.0, 448.0]
    """
    arr = as_float_array(x, "x")
    f = get_format(fmt)
    s = float(np.float32(scale))
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite float32 > 0; got {scale!r}")
    work = np.dtype(np.float64 if arr.dtype == np.float64 else np.float32)
    wide: np.ndarray = arr.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = wide * work.type(s)
    data = quantize(scaled, f, saturate=True).astype(np.float32)
    return Fp8Tensor(data, s, float(np.float32(1.0) / np.float32(s)), f, _amax(arr))


def quantize_current_scaling(x: Any, fmt: Format | str = "e4m3", *, margin: int = 0) -> Fp8Tensor:
    """Per-tensor current scaling: the scale comes from this tensor's own amax.

    ``scale = fp8_max / amax(x) / 2^margin`` (1.0 when amax is 0, inf or NaN).

    Example
    -------
    >>> t = quantize_current_scaling(np.array([0.5, -2.0], np.float32), "e4m3")
    >>> t.scale, t.data.tolist()
    (224.0, [112.0, -448.0])
    """
    arr = as_float_array(x, "x")
    f = get_format(fmt)
    m = check_int(margin, "margin")
    return fp8_quantize(arr, f, compute_scale(_amax(arr), f.max, m))


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe (settings only; state is in Fp8Meta).

    Parameters
    ----------
    margin: integer; scales are divided by 2^margin. amax_history_len: integer >= 1.
    amax_compute_algo: ``"max"`` or ``"most_recent"``.
    fp8_format: ``"HYBRID"`` (E4M3 forward, E5M2 backward), ``"E4M3"`` or ``"E5M2"``.
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_format: str = "HYBRID"

    def __post_init__(self) -> None:
        check_int(self.margin, "margin")
        check_int(self.amax_history_len, "amax_history_len", minimum=1)
        if self.amax_compute_algo not in _ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {_ALGOS}; "
                             f"got {self.amax_compute_algo!r}")
        if isinstance(self.fp8_format, str):  # accept "hybrid", "e4m3" too
            object.__setattr__(self, "fp8_format", self.fp8_format.upper())
        if self.fp8_format not in _FORMATS:
            raise ValueError(f"fp8_format must be one of {_FORMATS}; got {self.fp8_format!r}")

    def format_for(self, role: str) -> Format:
        """The FP8 format of a ``"forward"`` tensor or a ``"backward"`` (gradient) tensor."""
        if role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}; got {role!r}")
        if self.fp8_format == "E5M2" or (self.fp8_format == "HYBRID" and role == "backward"):
            return FLOAT8_E5M2
        return FLOAT8_E4M3FN


@dataclass
class Fp8Meta:
    """Delayed-scaling state of one tensor: amax history, scale, scale_inv.

    Example
    -------
    >>> meta = Fp8Meta(DelayedScaling(amax_history_len=2))
    >>> meta.quantize(np.array([2.0], np.float32)).data.tolist(); meta.update(); meta.scale
    [2.0]
    224.0
    """

    recipe: DelayedScaling
    role: str = "forward"
    amax_history: np.ndarray = field(init=False)
    scale: float = field(init=False, default=1.0)
    scale_inv: float = field(init=False, default=1.0)
    fmt: Format = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, DelayedScaling):
            raise TypeError(f"recipe must be a DelayedScaling; got {type(self.recipe).__name__}")
        self.fmt = self.recipe.format_for(self.role)
        self.amax_history = np.zeros(self.recipe.amax_history_len, np.float32)  # L

    def quantize(self, x: Any) -> Fp8Tensor:
        """Quantise with the current scale and record amax(x) into history slot 0."""
        t = fp8_quantize(x, self.fmt, self.scale)
        h0 = float(self.amax_history[0])
        # running max over the step; a NaN amax sticks until the slot is zeroed
        self.amax_history[0] = (
            math.nan if math.isnan(h0) or math.isnan(t.amax) else max(h0, t.amax)
        )
        return t

    def update(self) -> None:
        """End of step: amax from the history, new scale and scale_inv, then roll."""
        h = self.amax_history
        if self.recipe.amax_compute_algo == "max":
            amax = float(np.max(h))  # NaN propagates: the scale is then kept
        else:
            amax = float(h[0])
        self.scale = compute_scale(amax, self.fmt.max, self.recipe.margin, self.scale)
        self.scale_inv = float(np.float32(1.0) / np.float32(self.scale))
        self.amax_history = np.roll(h, -1)
        self.amax_history[0] = 0.0
