r"""Scale arithmetic of the per-tensor and blockwise recipes, written once for every backend.

Dimension letters: L amax history length, `...` any leading axes.

Each function takes arrays of one namespace `xp` (NumPy or torch, see
[normlab.precision.scaled.namespace][]) and returns arrays of it; nothing is read back to the
host, so the torch path traces under `torch.compile` and stays on the device. The NumPy
recipes ([quantize_current_scaling][normlab.precision.quantize_current_scaling],
[Fp8Meta][normlab.precision.Fp8Meta], [blockwise_quantize][normlab.precision.blockwise_quantize],
[nvfp4_quantize][normlab.precision.nvfp4_quantize]), their torch twins and the training
layer all call these functions.

Scale from amax (Transformer Engine's `compute_scale_from_amax`,
`transformer_engine/common/recipe/recipe_common.cuh`), in float32:

$$
a = \max(\mathrm{amax}, \epsilon), \qquad
s = \begin{cases} \dfrac{m_{fp8} \cdot 2^{-\mathrm{margin}}}{a} & a \text{ finite and } > 0 \\
s_{prev} & \text{otherwise (1 for current and block scaling)} \end{cases}
$$

with an infinite quotient replaced by `value_for_inf` (float32's max; TE's blockwise cast
uses the input dtype's max, `compute_scale_from_types`), a quotient below $2^{-127}$ raised
to $2^{-127}$ (normlab's one deviation: the smallest power of two whose float32 reciprocal
is finite, so a margin large enough to underflow the scale cannot make the next cast
divide by zero), and with `power_of_2_scales` the float32 mantissa cleared (rounded down
to a power of two). The `"unfused"` update of TE forms the quotient as
$\mathrm{float32}(m_{fp8} \cdot \mathrm{float32}(1 / a)) \cdot 2^{-\mathrm{margin}}$ instead
(torch evaluates `python_float / tensor` as a reciprocal times the float).

Delayed update (TE `DelayedScaling`), once per step after the amaxes of the step were
recorded into history slot 0 as a running max:

- `"fused"` (TE 2.x default, `delayed_scaling.cu`): `last = h[0]`; if `last != 0` (NaN
  counts as nonzero) the history rolls (`[0, h[2], ..., h[L-1], last]`) and amax is the
  `fmaxf` reduction, started at 0, over every slot before the roll, so NaN slots are
  skipped; if `last == 0` nothing rolls and amax is 0, which keeps the scale.
- `"unfused"` (`NVTE_UNFUSED_FP8_UPDATE`, TE's `fp8.py`): amax is `torch.max` over the
  history (a NaN propagates and keeps the scale while it is in the window); the history
  always rolls.
- `amax_compute_algo="most_recent"` takes `last` instead of the window's max, in both.
"""

from __future__ import annotations

from typing import Any

from normlab.precision.scaled.namespace import F32_MAX, ArrayNamespace, namespace_of

__all__ = [
    "MIN_SCALE",
    "UPDATES",
    "delayed_update",
    "power_of_two_floor",
    "record_amax",
    "scale_from_amax",
]

UPDATES = ("fused", "unfused")
"""The two delayed-scaling updates: TE 2.x's fused kernel and TE's unfused torch path."""

MIN_SCALE = 2.0**-127
"""The smallest scale [scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] returns,
`0x1p-127`: the smallest power of two whose float32 reciprocal is finite."""

_MARGIN_CLAMP = 400  # |margin| beyond this gives the same float32 result (0 or inf)


def _pow2(margin: int) -> float:
    """2^-margin as a float64, the exponent clamped where float32 results stop changing."""
    return 2.0 ** max(-_MARGIN_CLAMP, min(_MARGIN_CLAMP, -int(margin)))




def power_of_two_floor(scale: Any, *, xp: ArrayNamespace | None = None) -> Any:
    """`scale` (float32) with its mantissa bits cleared: rounded down to a power of two.

    Parameters
    ----------
    scale : array of float32
        Positive finite scales.
    xp : ArrayNamespace, optional
        The namespace of `scale` (default: inferred).

    Returns
    -------
    out : array of float32
        `scale`'s bits `& 0xFF800000`; float32's max becomes $2^{127}$.

    Examples
    --------
    >>> float(power_of_two_floor(np.float32(149.3)))
    128.0
    """
    xp = namespace_of(scale) if xp is None else xp
    bits = xp.bits32(xp.astype(scale, "float32"))
    return xp.from_bits32(bits & xp.scalar(-(1 << 23), bits))  # 0xFF800000 as int32


def scale_from_amax(
    amax: Any,
    fp8_max: float,
    *,
    margin: int = 0,
    epsilon: float = 0.0,
    power_of_2_scales: bool = False,
    previous: Any = None,
    update: str = "fused",
    value_for_inf: float = F32_MAX,
    xp: ArrayNamespace | None = None,
) -> Any:
    r"""The float32 scale for each amax (formula in the module header).

    Parameters
    ----------
    amax : array
        Amaxes of any float dtype (rounded to float32 first, as the recipes keep them).
    fp8_max : float
        The largest value of the target format (448 for E4M3, 2688 = 448 x 6 for the NVFP4
        tensor scale).
    margin : int, optional
        Scales are divided by $2^{\mathrm{margin}}$. Default 0.
    epsilon : float, optional
        Lower bound on the amax. Default 0.
    power_of_2_scales : bool, optional
        Round each scale down to a power of two. Default False.
    previous : array, optional
        The scale kept where the amax is 0, inf or NaN (broadcast against `amax`); default 1.
    update : {"fused", "unfused"}, optional
        How the quotient is formed (see the module header). Default `"fused"`.
    value_for_inf : float, optional
        The scale where the quotient overflows float32. Default float32's max.
    xp : ArrayNamespace, optional
        The namespace of `amax` (default: inferred).

    Returns
    -------
    scale : array of float32
        `amax`'s shape (broadcast with `previous`).

    Examples
    --------
    >>> scale_from_amax(np.float32(3.5), 448.0).item()
    128.0
    >>> scale_from_amax(np.float32(0.0), 448.0, previous=np.float32(2.0)).item()
    2.0
    """
    xp = namespace_of(amax) if xp is None else xp
    with xp.quiet():
        a = xp.astype(amax, "float32")
        eps = xp.scalar(epsilon, a)  # rounded to float32
        a = xp.where(a < eps, eps, a)  # NaN < eps is False: NaN stays NaN
        ok = xp.isfinite(a) & (a > xp.scalar(0.0, a))
        one = xp.scalar(1.0, a)
        safe = xp.where(ok, a, one)
        if update == "fused":  # (fp8_max * 2^-margin) / a, the numerator rounded to float32
            wide = xp.astype(xp.scalar(fp8_max, a), "float64")  # float32(fp8_max), exactly
            scaled_max = xp.astype(wide * xp.scalar(_pow2(margin), wide), "float32")
            s = scaled_max / safe
        else:  # float32(fp8_max * float32(1 / a)) * 2^-margin, rounded once to float32
            q = xp.scalar(fp8_max, a) * (one / safe)
            s = xp.astype(xp.astype(q, "float64") * xp.scalar(_pow2(margin), q, "float64"),
                          "float32")
        s = xp.where(xp.isinf(s), xp.scalar(value_for_inf, s), s)
        s = xp.maximum(s, xp.scalar(MIN_SCALE, s))
        if power_of_2_scales:
            s = power_of_two_floor(s, xp=xp)
        keep = one if previous is None else xp.astype(previous, "float32")
        return xp.where(ok, s, keep)


def record_amax(history: Any, amax: Any, *, xp: ArrayNamespace | None = None) -> Any:
    """`history` with slot 0 raised to `amax` (a running max; a NaN sticks).

    Parameters
    ----------
    history : array of float32, shape (..., L)
        The amax history.
    amax : array, shape (...)
        This quantisation's amax (any float dtype; rounded to float32, which commutes with
        the max).
    xp : ArrayNamespace, optional
        The namespace (default: inferred from `history`).

    Returns
    -------
    history : array of float32, shape (..., L)
        A new history; the input is not modified.
    """
    xp = namespace_of(history) if xp is None else xp
    h0 = history[..., :1]  # ...,1
    a = xp.reshape(xp.astype(amax, "float32"), h0.shape)
    return xp.concat([xp.maximum(h0, a), history[..., 1:]], axis=-1)  # ...,L


def _rolled(h: Any, xp: ArrayNamespace) -> Any:
    """`[0, h[2], ..., h[L-1], h[0]]` along the last axis (all zeros for L = 1)."""
    zero = xp.full((*h.shape[:-1], 1), 0.0, h)  # ...,1
    if h.shape[-1] == 1:
        return zero
    return xp.concat([zero, h[..., 2:], h[..., :1]], axis=-1)  # ...,L


def delayed_update(
    history: Any,
    scale: Any,
    fp8_max: float,
    *,
    margin: int = 0,
    amax_compute_algo: str = "max",
    update: str = "fused",
    xp: ArrayNamespace | None = None,
) -> tuple[Any, Any]:
    """One delayed-scaling update: the new (history, scale) (rules in the module header).

    Parameters
    ----------
    history : array of float32, shape (..., L)
        The amax history after this step's amaxes were recorded into slot 0.
    scale : array of float32, shape (...)
        The scale used in this step.
    fp8_max : float
        The largest value of the format.
    margin : int, optional
        Scales are divided by 2^margin. Default 0.
    amax_compute_algo : {"max", "most_recent"}, optional
        The window's max or the last amax. Default `"max"`.
    update : {"fused", "unfused"}, optional
        TE 2.x's fused update or TE's unfused one. Default `"fused"`.
    xp : ArrayNamespace, optional
        The namespace (default: inferred from `history`).

    Returns
    -------
    history : array of float32, shape (..., L)
        The rolled (or, fused with a zero last amax, unchanged) history.
    scale : array of float32, shape (...)
        The scale for the next step.

    Examples
    --------
    >>> h = np.array([10.0, 0.0], np.float32)
    >>> h, s = delayed_update(h, np.float32(1.0), 448.0)
    >>> h.tolist(), s.item()
    ([0.0, 10.0], 44.79999923706055)
    """
    xp = namespace_of(history) if xp is None else xp
    h = xp.astype(history, "float32")
    last = h[..., 0]  # ...
    rolled = _rolled(h, xp)
    if update == "fused":
        rolls = last != xp.scalar(0.0, last)  # NaN != 0: a NaN step rolls
        zero = xp.scalar(0.0, h)
        window = xp.maximum(xp.max(xp.where(xp.isnan(h), zero, h), axis=-1), zero)
        amax = xp.where(rolls, window, xp.scalar(0.0, window))
        new_history = xp.where(rolls[..., None], rolled, h)
    else:
        amax = xp.max(h, axis=-1)  # NaN propagates (torch.max)
        new_history = rolled
    if amax_compute_algo == "most_recent":
        amax = last
    new_scale = scale_from_amax(amax, fp8_max, margin=margin, previous=scale, update=update,
                                xp=xp)
    return new_history, new_scale
