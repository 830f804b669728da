r"""Per-tensor FP8 scaling: current scaling and Transformer Engine's delayed scaling.

Contract: an FP8 tensor is `data = sat_round(x * scale)` (values of E4M3 or E5M2, held in
float32) plus `scale_inv = float32(1 / scale)`; `dequantize() = data * scale_inv`.
Overflow saturates to $\pm$max (Transformer Engine casts with saturation); NaN stays NaN.
`x * scale` is formed in float64 for float64 input (any byte order), else in float32.

Current scaling (TE `Float8CurrentScaling`): the scale comes from the tensor's own amax by
[scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] (TE's
`compute_scale_from_amax`): $a = \max(\mathrm{amax}(x), \epsilon)$,
$s = m_{fp8} \cdot 2^{-\mathrm{margin}} / a$ in float32, 1 when $a$ is 0, inf or NaN,
float32's max when the quotient overflows, and with `power_of_2_scales` rounded down to a
power of two.

Delayed scaling (TE `DelayedScaling`; Micikevicius et al., "FP8 Formats for Deep
Learning", 2022): each tensor keeps an amax history of length L, zero at the start, and a
scale (1.0 at the start). `quantize` uses the *current* scale and records the tensor's
amax into slot 0 (a running max if the tensor is quantised several times in a step);
`update` (once per step, after backward) computes the new scale from the history and
rolls it, by TE 2.x's fused rule or TE's unfused one, chosen by
[DelayedScaling][normlab.precision.DelayedScaling]`.update`; both are
[delayed_update][normlab.precision.scaled.scales.delayed_update]. HYBRID: E4M3 for forward
tensors, E5M2 for gradients. The settings live in [normlab.precision.scaled.recipes][]; the
arithmetic in [normlab.precision.scaled.scales][] and
[normlab.precision.scaled.arithmetic][], shared with the torch twin and the training layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_amax_epsilon,
    check_axis,
    check_bool,
    check_finite_real,
    check_int,
)
from normlab.precision.formats.format import Format, get_format
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled import scales
from normlab.precision.scaled.namespace import NUMPY, ArrayNamespace, namespace_of
from normlab.precision.scaled.recipes import DelayedScaling

__all__ = [
    "DelayedScaling",
    "Fp8Meta",
    "Fp8Tensor",
    "compute_scale",
    "fp8_quantize",
    "quantize_current_scaling",
]


def compute_scale(amax: float, fp8_max: float, margin: int = 0, previous: float = 1.0, *,
                  update: str = "fused") -> float:
    r"""The float32 scale for one amax; `previous` if the amax is 0, inf or NaN.

    [scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] on one number:
    `"fused"` (TE 2.x) forms $(m_{fp8} \cdot 2^{-\mathrm{margin}}) / \mathrm{amax}$,
    `"unfused"` $(m_{fp8} / \mathrm{amax}) / 2^{\mathrm{margin}}$; an infinite scale
    becomes float32's max, one below $2^{-127}$ becomes $2^{-127}$.

    Parameters
    ----------
    amax : float
        The amax.
    fp8_max : float
        The format's largest value.
    margin : int, optional
        Default 0.
    previous : float, optional
        The scale kept for an amax of 0, inf or NaN. Default 1.
    update : {"fused", "unfused"}, optional
        Default `"fused"`.

    Returns
    -------
    scale : float
        A float32 value.

    Examples
    --------
    >>> compute_scale(3.5, 448.0), compute_scale(0.0, 448.0, previous=2.0)
    (128.0, 2.0)
    """
    if update not in scales.UPDATES:
        raise ValueError(f"update must be one of {scales.UPDATES}; got {update!r}")
    with np.errstate(over="ignore"):
        a = np.float32(amax)
    s = scales.scale_from_amax(a, fp8_max, margin=check_int(margin, "margin"),
                        previous=np.float32(previous), update=update, xp=NUMPY)
    return float(s)


@dataclass(frozen=True)
class Fp8Tensor:
    """An FP8 tensor: `data * scale_inv` approximates the input.

    The result of [fp8_quantize][normlab.precision.fp8_quantize] and its torch twin: NumPy
    arrays and floats here, tensors on the input's device (0-d for the scalars) there.

    Attributes
    ----------
    data : numpy.ndarray or torch.Tensor
        float32 values of `fmt`, the input's shape.
    scale : float, numpy.ndarray or torch.Tensor
        The float32 scale `data` was formed with (one per slice for axis-wise current
        scaling: the input's shape with size 1 along the axis).
    scale_inv : float, numpy.ndarray or torch.Tensor
        `float32(1 / scale)`.
    fmt : Format
        E4M3 or E5M2 (or any format).
    amax : float or torch.Tensor
        max |x| of the input (NaN if it held one; float64).
    """

    data: Any
    scale: Any
    scale_inv: Any
    fmt: Format
    amax: Any

    def dequantize(self) -> Any:
        """`data * scale_inv` in float32 (a product beyond float32's range is inf)."""
        xp = namespace_of(self.data)
        with xp.quiet():
            return self.data * xp.astype(self.scale_inv, "float32")


def fp8_quantize(x: Any, fmt: Format | str, scale: float) -> Fp8Tensor:
    """`sat_round(x * scale)` with `x * scale` formed in float32 (float64 input: float64).

    Parameters
    ----------
    x : array_like
        The values to quantise (any float dtype).
    fmt : Format or str
        E4M3, E5M2 or any format.
    scale : float
        The encode scale: a finite float32 > 0.

    Returns
    -------
    t : Fp8Tensor
        `data`, `scale`, `scale_inv` and the input's amax.

    Raises
    ------
    ValueError
        If `scale` is not a finite float32 > 0.

    Examples
    --------
    >>> fp8_quantize(np.array([1.0, 1000.0], np.float32), "e4m3", 1.0).data.tolist()
    [1.0, 448.0]
    """
    arr = as_float_array(x, "x")
    f = get_format(fmt)
    with np.errstate(over="ignore"):
        s = np.float32(check_finite_real(scale, "scale"))
    if not (np.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite float32 > 0; got {scale!r}")
    return _fp8_tensor(arr, f, s)


def _fp8_tensor(arr: np.ndarray, fmt: Format, scale: Any) -> Fp8Tensor:
    data, inv = core.per_tensor_quantize(arr, fmt, scale, xp=NUMPY)
    amax = float(core.tensor_amax(arr, xp=NUMPY))
    if np.ndim(scale):  # axis-wise: one scale per slice
        return Fp8Tensor(data, scale, inv, fmt, amax)
    return Fp8Tensor(data, float(scale), float(inv), fmt, amax)


def quantize_current_scaling(x: Any, fmt: Format | str = "e4m3", *, margin: int = 0,
                             amax_epsilon: float = 0.0, power_of_2_scales: bool = False,
                             axis: int | None = None) -> Fp8Tensor:
    r"""Current scaling: the scale comes from this tensor's own amax (or each slice's).

    $a = \max(\mathrm{amax}(x), \epsilon)$,
    $s = m_{fp8} \cdot 2^{-\mathrm{margin}} / a$ (1 when $a$ is 0, inf or NaN), rounded
    down to a power of two with `power_of_2_scales` (TE `Float8CurrentScaling`; see the
    module header). With `axis`, the amax and the scale are per slice along that axis
    (torchao's axiswise granularity: `axis=-1` scales each row; with `amax_epsilon=1e-12`
    and `power_of_2_scales=True` its rowwise recipes' operands, but for a slice holding an
    inf or a NaN, whose scale is 1 here and 0 or NaN there).

    Parameters
    ----------
    x : array_like
        Float input.
    fmt : Format or str, optional
        Default `"e4m3"`.
    margin : int, optional
        Default 0.
    amax_epsilon : float, optional
        Lower bound $\epsilon \ge 0$ on the amax. Default 0.
    power_of_2_scales : bool, optional
        Default False.
    axis : int or None, optional
        Reduce the amax along this axis only, kept as a size-1 dimension of the scale;
        None (default): one scale for the tensor.

    Returns
    -------
    t : Fp8Tensor
        The data, scales and amax (with `axis`: scales of x's shape, size 1 along it).

    Raises
    ------
    TypeError
        Non-float `x`, a non-int margin, a non-bool flag.
    ValueError
        A negative or non-finite `amax_epsilon`, an unknown format, an axis out of range.

    Examples
    --------
    >>> t = quantize_current_scaling(np.array([0.5, -2.0], np.float32), "e4m3")
    >>> t.scale, t.data.tolist()
    (224.0, [112.0, -448.0])
    >>> quantize_current_scaling(np.array([3.0], np.float32), power_of_2_scales=True).scale
    128.0
    >>> quantize_current_scaling(np.float32([[1, -2], [0.25, 0.5]]), axis=-1).scale.tolist()
    [[224.0], [896.0]]
    """
    arr = as_float_array(x, "x")
    f = get_format(fmt)
    return _fp8_tensor(arr, f, current_scale_of(arr, f, margin, amax_epsilon, power_of_2_scales,
                                                axis=axis, xp=NUMPY))


def current_scale_of(x: Any, fmt: Format, margin: Any, amax_epsilon: Any,
                     power_of_2_scales: Any, *, axis: Any = None,
                     xp: ArrayNamespace) -> Any:
    """The checks of [quantize_current_scaling][normlab.precision.quantize_current_scaling],
    shared with its torch twin, then the current scale of `x` (an array of `xp`; per slice
    along `axis` when it is given)."""
    axis = None if axis is None else check_axis(axis, len(x.shape))
    m = check_int(margin, "margin")
    eps = check_amax_epsilon(amax_epsilon)
    pow2 = check_bool(power_of_2_scales, "power_of_2_scales")
    return core.current_scale(x, fmt, margin=m, epsilon=eps, power_of_2_scales=pow2,
                              axis=axis, xp=xp)


@dataclass
class Fp8Meta:
    """Delayed-scaling state of one tensor: amax history (L,), scale, scale_inv.

    Attributes
    ----------
    recipe : DelayedScaling
        The settings (an [Fp8DelayedRecipe][normlab.precision.scaled.recipes.Fp8DelayedRecipe]
        works too).
    role : {"forward", "backward"}
        Picks the format under HYBRID. Default `"forward"`.
    amax_history : numpy.ndarray
        float32, shape (L,); slot 0 is the current step's running max.
    scale : float
        The float32 scale the next quantisation uses (1 at the start).
    scale_inv : float
        `float32(1 / scale)`.
    fmt : Format
        The FP8 format of `role`.

    Examples
    --------
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
        """Quantise with the current scale and record amax(x) into history slot 0 (a
        running max over the step; a NaN sticks until the slot is zeroed)."""
        t = fp8_quantize(x, self.fmt, self.scale)
        with np.errstate(over="ignore"):
            self.amax_history = scales.record_amax(self.amax_history, np.float64(t.amax), xp=NUMPY)
        return t

    def update(self) -> None:
        """End of step: amax from the history, new scale and scale_inv, then roll
        ([delayed_update][normlab.precision.scaled.scales.delayed_update])."""
        r = self.recipe
        history, scale = scales.delayed_update(
            self.amax_history, np.float32(self.scale), self.fmt.max, margin=r.margin,
            amax_compute_algo=r.amax_compute_algo, update=r.update, xp=NUMPY)
        self.amax_history, self.scale = history, float(scale)
        self.scale_inv = float(np.float32(1.0) / np.float32(self.scale))

    def state_dict(self) -> dict[str, Any]:
        """The state as NumPy arrays and Python scalars (safe for `np.savez` and pickle).

        Returns
        -------
        state : dict
            `amax_history` (float32, L), `scale`, `scale_inv` (floats), `role`,
            `fp8_format`, `amax_history_len` (checked on load against this meta).
        """
        return {"amax_history": self.amax_history.copy(), "scale": float(self.scale),
                "scale_inv": float(self.scale_inv), "role": self.role,
                "fp8_format": self.recipe.fp8_format,
                "amax_history_len": int(self.recipe.amax_history_len)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()` (0-d arrays from `np.load` accepted).

        `scale_inv` is recomputed from `scale`. Everything is validated before anything
        changes.

        Parameters
        ----------
        state : Mapping
            The keys of `state_dict()`.

        Raises
        ------
        ValueError, TypeError
            Another history length, role or format, a negative amax in the history (NaN
            and inf, which `quantize` records, are kept), or a scale that is not a finite
            float32 > 0; the meta is left as it was.
        """
        history, scale = checked_meta_state(state, self.role, self.recipe)
        self.amax_history, self.scale = history, scale
        self.scale_inv = float(np.float32(1.0) / np.float32(scale))


def _item(state: Mapping[str, Any], key: str) -> Any:
    if not isinstance(state, Mapping) or key not in state:
        raise ValueError(f"state must be a mapping with the key {key!r} (from state_dict()); "
                         f"got keys {sorted(state) if isinstance(state, Mapping) else state!r}")
    v = state[key]
    return v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v


def checked_meta_state(state: Mapping[str, Any], role: str,
                       recipe: DelayedScaling) -> tuple[np.ndarray, float]:
    """(history float32 (L,), scale) from a delayed-scaling state dict, validated against
    the meta's `role` and `recipe` (shared by the NumPy and torch metas)."""
    for key, want in (("role", role), ("fp8_format", recipe.fp8_format),
                      ("amax_history_len", recipe.amax_history_len)):
        got = _item(state, key)
        if got != want or type(got) is bool:
            raise ValueError(f"state[{key!r}] must equal this meta's {want!r}; got {got!r}")
    h = checked_amax_history(_item(state, "amax_history"), "state['amax_history']",
                             (recipe.amax_history_len,))
    scale = check_finite_real(_item(state, "scale"), "state['scale']")
    return h, float(checked_scales(np.float64(scale), "state['scale']"))


def checked_amax_history(history: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An amax history of `shape` as float32, or ValueError/TypeError naming `name`.

    Amaxes are >= 0: a negative entry (or -inf) is refused. NaN and +inf are accepted:
    [quantize][normlab.precision.Fp8Meta.quantize] records them (a NaN input, an amax
    beyond float32) and [delayed_update][normlab.precision.scaled.scales.delayed_update] handles
    them, so a state saved after such a step must load again. Shared by the NumPy meta and
    the torch layers' extra state.
    """
    h = as_float_array(history, name)
    if h.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {h.shape}")
    with np.errstate(invalid="ignore"):
        negative = h < 0  # NaN compares False: kept
    if bool(np.any(negative)):
        raise ValueError(f"{name} must hold amaxes >= 0 (NaN and inf are kept as recorded); "
                         f"got {h[negative].ravel()[0]!r} at index "
                         f"{np.argwhere(negative)[0].tolist()}")
    return h.astype(np.float32)


def checked_scales(scales: Any, name: str) -> np.ndarray:
    """Scales as float32, each a finite float32 > 0 (what every scale rule produces), or
    ValueError naming `name` and the first bad value; TypeError for a non-float array."""
    arr = as_float_array(scales, name)
    f64 = arr.astype(np.float64)
    bad = ~(np.isfinite(f64) & (f64 > 0) & (f64 <= float(np.finfo(np.float32).max)))
    if bool(np.any(bad)):
        raise ValueError(f"{name} must be a finite float32 > 0 (each scale); got "
                         f"{f64[bad].ravel()[0]!r}")
    return arr.astype(np.float32)
