"""Per-tensor FP8 scaling: current scaling and Transformer Engine's delayed scaling.

Contract: an FP8 tensor is ``data = sat_round(x * scale)`` (values of E4M3 or E5M2, held in
float32) plus ``scale_inv = float32(1 / scale)``; ``dequantize() = data * scale_inv``.
Overflow saturates to +-max (Transformer Engine casts with saturation); NaN stays NaN.
``x * scale`` is formed in float64 for float64 input (any byte order), else in float32.

Current scaling (TE ``Float8CurrentScaling``; its scale rule is
``transformer_engine/common/recipe/recipe_common.cuh``, ``compute_scale_from_amax``):
``a = max(amax(x), amax_epsilon)``; scale 1 if a is 0, inf or NaN; else
``scale = (fp8_max * 2^-margin) / a`` in float32, inf -> FLT_MAX; with
``power_of_2_scales`` the scale's float32 mantissa is cleared (rounded down to a power
of two, so FLT_MAX -> 2^127).

Delayed scaling (TE ``DelayedScaling``; Micikevicius et al., "FP8 Formats for Deep
Learning", 2022): each tensor keeps an amax history of length L, zero at the start, and a
scale (1.0 at the start). ``quantize`` uses the *current* scale and records the tensor's
amax into slot 0 (as a running max if the tensor is quantised several times in a step).
``update`` (once per step, after backward) computes the new scale from the history and
rolls it, by one of TE's two updates, chosen by ``DelayedScaling.update``: ``"fused"``,
TE 2.x's default (``delayed_scaling.cu``: NaN amaxes are skipped; a step whose amax is 0
neither rolls the history nor changes the scale) or ``"unfused"``
(``NVTE_UNFUSED_FP8_UPDATE``, ``fp8.py``: ``torch.max``, a NaN freezes the scale while it
is in the window). :mod:`normlab.precision._delayed_update` states both exactly.
HYBRID: E4M3 for forward tensors, E5M2 for gradients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real, check_int
from normlab.precision import _blocks
from normlab.precision import _delayed_update as _du
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

_FORMATS = ("HYBRID", "E4M3", "E5M2")
_ALGOS = ("max", "most_recent")
_ROLES = ("forward", "backward")


def compute_scale(amax: float, fp8_max: float, margin: int = 0, previous: float = 1.0, *,
                  update: str = "fused") -> float:
    """The float32 scale for one amax; ``previous`` if amax is 0, inf or NaN.

    ``"fused"`` (TE 2.x): ``(fp8_max * 2^-margin) / amax``; ``"unfused"``:
    ``(fp8_max / amax) / 2^margin``; an infinite scale becomes FLT_MAX, one below 2^-127
    becomes 2^-127 (see :mod:`normlab.precision._delayed_update`).

    Example
    -------
    >>> compute_scale(3.5, 448.0), compute_scale(0.0, 448.0, previous=2.0)
    (128.0, 2.0)
    """
    if update not in _du.UPDATES:
        raise ValueError(f"update must be one of {_du.UPDATES}; got {update!r}")
    return _du.scale_from_amax(amax, previous, fp8_max, check_int(margin, "margin"), update)


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
    work = _blocks.work_dtype(arr)  # '>f8' included
    wide: np.ndarray = arr.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = wide * work.type(s)
    data = quantize(scaled, f, saturate=True).astype(np.float32)
    return Fp8Tensor(data, s, float(np.float32(1.0) / np.float32(s)), f, _amax(arr))


def quantize_current_scaling(x: Any, fmt: Format | str = "e4m3", *, margin: int = 0,
                             amax_epsilon: float = 0.0,
                             power_of_2_scales: bool = False) -> Fp8Tensor:
    """Per-tensor current scaling: the scale comes from this tensor's own amax.

    ``a = max(amax(x), amax_epsilon)``, ``scale = (fp8_max * 2^-margin) / a`` (1 when a is
    0, inf or NaN), rounded down to a power of two with ``power_of_2_scales`` (TE
    ``Float8CurrentScaling`` and ``compute_scale_from_amax``; see the module header).

    Example
    -------
    >>> t = quantize_current_scaling(np.array([0.5, -2.0], np.float32), "e4m3")
    >>> t.scale, t.data.tolist()
    (224.0, [112.0, -448.0])
    >>> quantize_current_scaling(np.array([3.0], np.float32), power_of_2_scales=True).scale
    128.0
    """
    arr = as_float_array(x, "x")
    f = get_format(fmt)
    m = check_int(margin, "margin")
    eps = check_finite_real(amax_epsilon, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {amax_epsilon!r}")
    if not isinstance(power_of_2_scales, (bool, np.bool_)):
        raise TypeError(f"power_of_2_scales must be a bool; got {power_of_2_scales!r}")
    a = _amax(arr)
    if a < eps:  # NaN stays NaN (NaN < eps is False), as in TE
        a = eps
    scale = _du.scale_from_amax(a, 1.0, f.max, m, "fused")
    if power_of_2_scales:
        scale = _pow2_floor(scale)
    return fp8_quantize(arr, f, scale)


def _pow2_floor(scale: float) -> float:
    """The float32 scale with its mantissa bits cleared (TE's power-of-two scales)."""
    bits = np.array(scale, np.float32).view(np.uint32) & np.uint32(0xFF800000)
    return float(bits.view(np.float32))


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's delayed-scaling recipe (settings only; state is in Fp8Meta).

    Parameters
    ----------
    margin: integer; scales are divided by 2^margin. amax_history_len: integer >= 1.
    amax_compute_algo: ``"max"`` or ``"most_recent"``.
    fp8_format: ``"HYBRID"`` (E4M3 forward, E5M2 backward), ``"E4M3"`` or ``"E5M2"``.
    update: ``"fused"`` (TE 2.x default, ``delayed_scaling.cu``) or ``"unfused"``
    (``NVTE_UNFUSED_FP8_UPDATE``, ``fp8.py``); see :mod:`normlab.precision._delayed_update`.

    Example
    -------
    >>> DelayedScaling(amax_history_len=16).format_for("backward").name
    'float8_e5m2'
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_format: str = "HYBRID"
    update: str = "fused"

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
        if self.update not in _du.UPDATES:
            raise ValueError(f"update must be one of {_du.UPDATES}; got {self.update!r}")

    def format_for(self, role: str) -> Format:
        """The FP8 format of a ``"forward"`` tensor or a ``"backward"`` (gradient) tensor."""
        if role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}; got {role!r}")
        if self.fp8_format == "E5M2" or (self.fp8_format == "HYBRID" and role == "backward"):
            return FLOAT8_E5M2
        return FLOAT8_E4M3FN


@dataclass
class Fp8Meta:
    """Delayed-scaling state of one tensor: amax history (L,), scale, scale_inv.

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
        r = self.recipe
        step = _du.fused_update if r.update == "fused" else _du.unfused_update
        self.amax_history, self.scale = step(self.amax_history, self.scale, self.fmt.max,
                                             r.margin, r.amax_compute_algo)
        self.scale_inv = float(np.float32(1.0) / np.float32(self.scale))

    def state_dict(self) -> dict[str, Any]:
        """The state as NumPy arrays and Python scalars (safe for ``np.savez`` and pickle).

        Keys: ``amax_history`` (float32, L), ``scale``, ``scale_inv`` (floats), ``role``,
        ``fp8_format``, ``amax_history_len`` (checked on load against this meta).
        """
        return {"amax_history": self.amax_history.copy(), "scale": float(self.scale),
                "scale_inv": float(self.scale_inv), "role": self.role,
                "fp8_format": self.recipe.fp8_format,
                "amax_history_len": int(self.recipe.amax_history_len)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (0-d arrays from ``np.load`` accepted).

        ``scale_inv`` is recomputed from ``scale``. Everything is validated before
        anything changes; a mismatch (another history
        length, role or format, a scale that is not a finite float32 > 0) raises
        ValueError/TypeError and leaves the meta as it was.
        """
        history, scale = _checked_state(state, self)
        self.amax_history, self.scale = history, scale
        self.scale_inv = float(np.float32(1.0) / np.float32(scale))


def _item(state: Mapping[str, Any], key: str) -> Any:
    if not isinstance(state, Mapping) or key not in state:
        raise ValueError(f"state must be a mapping with the key {key!r} (from state_dict()); "
                         f"got keys {sorted(state) if isinstance(state, Mapping) else state!r}")
    v = state[key]
    return v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v


def _checked_state(state: Mapping[str, Any], meta: Fp8Meta) -> tuple[np.ndarray, float]:
    for key, want in (("role", meta.role), ("fp8_format", meta.recipe.fp8_format),
                      ("amax_history_len", meta.recipe.amax_history_len)):
        got = _item(state, key)
        if got != want or type(got) is bool:
            raise ValueError(f"state[{key!r}] must equal this meta's {want!r}; got {got!r}")
    h = as_float_array(_item(state, "amax_history"), "state['amax_history']")
    if h.shape != (meta.recipe.amax_history_len,):
        raise ValueError(f"state['amax_history'] must have shape "
                         f"({meta.recipe.amax_history_len},); got {h.shape}")
    scale = check_finite_real(_item(state, "scale"), "state['scale']")
    if not 0 < scale <= float(np.finfo(np.float32).max):
        raise ValueError(f"state['scale'] must be a finite float32 > 0; got {scale!r}")
    return h.astype(np.float32), float(np.float32(scale))
