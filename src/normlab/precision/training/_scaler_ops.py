"""Array and scalar helpers of the loss scalers (`normlab.precision.training.loss_scaling`).

Contract: every helper validates before it writes; `multiply_in_place` is the only one
that changes arrays, and only after `collect_grads` accepted every one of them. Dtype
decisions use the native-byte-order dtype, so `'>f8'` gradients are unscaled in float64
exactly as `'<f8'` ones (never through float32).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_finite_real,
    check_int,
    check_mapping,
    check_writeable,
    native_dtype,
    scalar_item,
)

__all__ = [
    "as_f32_scale",
    "check_found_inf",
    "check_growth",
    "check_min_scale",
    "check_state_keys",
    "collect_grads",
    "found_inf",
    "inv",
    "multiply_in_place",
    "scale_loss",
]


def as_f32_scale(value: Any, name: str, *, allow_zero: bool = False,
                 allow_one_element: bool = False) -> float:
    """A finite scale > 0 (>= 0 with `allow_zero`) that keeps its meaning in float32.

    0-d arrays (what `np.load` gives back) are unwrapped; with `allow_one_element` so
    are 1-element arrays. A value that overflows float32, or a non-zero one that underflows
    to 0 there, is rejected.
    """
    v = check_finite_real(scalar_item(value, name, allow_one_element=allow_one_element), name)
    if v < 0.0 or (v == 0.0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        f = float(np.float32(v))
    if not math.isfinite(f) or (f == 0.0 and v != 0.0):
        raise ValueError(
            f"{name} must be representable as a finite, non-zero float32 "
            f"(between about 1.4e-45 and 3.4e38); got {value!r}"
        )
    return f


def inv(scale: float) -> float:
    """float32(1 / float64(scale)); a scale that underflowed to 0 gives inf (as in torch)."""
    if scale == 0.0:
        return math.inf
    with np.errstate(over="ignore"):
        return float(np.float32(1.0 / scale))


def collect_grads(grads: Any) -> list[np.ndarray]:
    """The gradient arrays to unscale in place; `None` entries (no gradient) are skipped."""
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
        check_writeable(g, f"grads[{i}]", "it is unscaled in place")
        out.append(g)
    return out


def found_inf(arrays: list[np.ndarray]) -> bool:
    """Any inf or NaN, checked on the scaled values before the multiplication (GradScaler)."""
    return any(not bool(np.isfinite(g).all()) for g in arrays)


def multiply_in_place(arrays: list[np.ndarray], inv_scale: float) -> None:
    """g <- g * inv_scale in float32 arithmetic (float64 for float64 arrays of any byte order)."""
    if inv_scale == 1.0:  # GradScaler leaves the values untouched in this case
        return
    with np.errstate(over="ignore", invalid="ignore"):
        for g in arrays:
            dt = native_dtype(g.dtype)
            if dt == np.float64:
                g *= np.float64(inv_scale)
            elif dt == np.float32:
                g *= np.float32(inv_scale)
            else:  # float16, bfloat16, fp8: widen, multiply in float32, round back
                g[...] = (g.astype(np.float32) * np.float32(inv_scale)).astype(g.dtype)


def check_found_inf(value: Any) -> bool:
    """found_inf: a bool or a number, non-zero meaning overflow (torch sums the found_inf
    flags of several optimizers, so counts above 1 occur); 0-d and 1-element arrays too.

    Note that `update(x)` reads x as this flag, while torch's `GradScaler.update(x)`
    sets the scale: use `update(new_scale=x)` for that.
    """
    v = scalar_item(value, "found_inf", allow_one_element=True)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return check_finite_real(v, "found_inf") != 0.0


def scale_loss(loss: Any, scale: float) -> Any:
    """loss * scale, computed in float32 (float64 for float64 losses), in loss's dtype."""
    if isinstance(loss, (bool, np.bool_)):
        raise TypeError(f"loss must be a real floating value; got {loss!r}")
    if isinstance(loss, (int, float)):
        return float(loss) * scale
    arr = as_float_array(loss, "loss")
    work = np.dtype(np.float64 if native_dtype(arr.dtype) == np.float64 else np.float32)
    wide: np.ndarray = arr.astype(work)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (wide * work.type(scale)).astype(arr.dtype)
    return out if isinstance(loss, np.ndarray) and loss.ndim > 0 else out[()]


def check_state_keys(state: Any, required: tuple[str, ...], allowed: tuple[str, ...],
                      owner: str) -> None:
    check_mapping(state, "state", f"a {owner} state dict")
    if len(state) == 0:
        raise ValueError("state is empty, possibly saved from a disabled GradScaler; "
                         f"a {owner} state needs the keys {list(required)}")
    missing = [k for k in required if k not in state]
    unexpected = sorted(str(k) for k in state if k not in allowed)
    if missing or unexpected:
        raise ValueError(f"state keys must be {list(allowed)} ({list(required)} required); "
                         f"missing {missing}, unexpected {unexpected}")


def check_growth(gf: Any, bf: Any, gi: Any, prefix: str) -> tuple[float, float, int]:
    """growth_factor > 1, backoff_factor in (0, 1), growth_interval >= 1 (0-d arrays ok)."""
    def name(key: str) -> str:
        return f"{prefix}[{key!r}]" if prefix else key

    g = check_finite_real(scalar_item(gf, name("growth_factor")), name("growth_factor"))
    if g <= 1.0:
        raise ValueError(f"{name('growth_factor')} must be > 1 (it grows the scale); got {gf!r}")
    b = check_finite_real(scalar_item(bf, name("backoff_factor")), name("backoff_factor"))
    if not 0.0 < b < 1.0:
        raise ValueError(
            f"{name('backoff_factor')} must be in (0, 1) (it shrinks the scale); got {bf!r}"
        )
    interval = check_int(scalar_item(gi, name("growth_interval")), name("growth_interval"),
                         minimum=1)
    return g, b, interval


def check_min_scale(ms: Any, scale: float, name: str, scale_name: str) -> float | None:
    """None (no floor) or a float32 floor in (0, scale]."""
    if ms is None:
        return None
    m = as_f32_scale(ms, name)
    if m > scale:
        raise ValueError(f"{name} must be <= {scale_name} ({scale}); got {ms!r}")
    return m
