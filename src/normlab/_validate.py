"""The one place where public inputs are checked.

Contract: every public function of normlab calls these helpers *before* it touches any
state (running statistics, optimizer moments, scaler counters), so a rejected call changes
nothing. Each helper raises a builtin exception (`TypeError` for the wrong kind of
object or dtype, `ValueError` for a wrong value or shape) whose message names the
argument, echoes what was received and says what is allowed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "as_float_array",
    "as_native",
    "as_shape",
    "check_bool",
    "check_eps",
    "check_eps_for",
    "check_finite_real",
    "check_generator",
    "check_int",
    "check_mapping",
    "check_nonneg",
    "check_out",
    "check_out_tuple",
    "check_positive",
    "check_probability",
    "check_shape",
    "check_trailing",
    "check_writeable",
    "compute_dtype",
    "is_float_dtype",
    "native_dtype",
    "optional_float_array",
    "optional_grad",
    "scalar_item",
]

# The 2-byte and smaller float types that ml_dtypes adds; numpy does not count them as
# np.floating, so they are recognised through ml_dtypes.finfo instead.
_ML_FLOAT_NAMES = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e4m3",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e3m4",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
)
_ML_FLOAT_DTYPES = frozenset(
    np.dtype(getattr(ml_dtypes, name)) for name in _ML_FLOAT_NAMES if hasattr(ml_dtypes, name)
)


# Answers per np.dtype instance (a handful of dtypes per process): the hot path of every
# public call is then one dict lookup instead of np.issubdtype (~1 us each).
_IS_FLOAT: dict[np.dtype, bool] = {}
_COMPUTE: dict[np.dtype, np.dtype] = {}


def is_float_dtype(dtype: Any) -> bool:
    """True for numpy's real floating dtypes and the ml_dtypes float types (bfloat16, fp8...)."""
    known = _IS_FLOAT.get(dtype) if isinstance(dtype, np.dtype) else None
    if known is not None:
        return known
    dt = np.dtype(dtype)
    result = bool(np.issubdtype(dt, np.floating)) or dt in _ML_FLOAT_DTYPES
    _IS_FLOAT[dt] = result
    return result


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype statistics are accumulated in: float64 for float64, else float32.

    float16, bfloat16 and the fp8 types are widened to float32 (never computed in their own
    precision); float32 stays float32; float64 (and longdouble) use float64.
    """
    known = _COMPUTE.get(dtype) if isinstance(dtype, np.dtype) else None
    if known is not None:
        return known
    dt = native_dtype(dtype)  # '>f8' is float64 too: never a silent float32 downgrade
    wide = dt == np.float64 or (np.issubdtype(dt, np.floating) and dt.itemsize > 8)
    result = np.dtype(np.float64 if wide else np.float32)
    _COMPUTE[np.dtype(dtype)] = result
    return result


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"an array of dtype {x.dtype} and shape {x.shape}"
    return f"{type(x).__name__} {x!r}"[:120]


def as_float_array(x: Any, name: str, *, min_ndim: int = 0) -> np.ndarray:
    """Return `x` as a real floating ndarray without copying when it already is one.

    Lists and scalars of Python floats are converted (to float64). Integer, boolean,
    complex and object inputs raise `TypeError`: normalising integers silently would hide
    a caller's bug, and complex inputs have no ordering for the statistics.
    """
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (bool, np.bool_)) or x is None:
        raise TypeError(f"{name} must be a real floating-point array; got {_describe(x)}")
    else:
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as exc:  # ragged lists and the like
            raise TypeError(
                f"{name} must be a real floating-point array; got {_describe(x)} ({exc})"
            ) from None
    if not is_float_dtype(arr.dtype):
        raise TypeError(
            f"{name} must have a real floating dtype (float16, bfloat16, float32, float64); "
            f"got dtype {arr.dtype}. Convert it first, e.g. {name}.astype(np.float32)."
        )
    if arr.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimension(s); got shape {arr.shape}"
        )
    return arr


def optional_float_array(x: Any, name: str) -> np.ndarray | None:
    """Like `as_float_array` but passes `None` through (no affine / no bias)."""
    return None if x is None else as_float_array(x, name)


def optional_grad(grad: Any, shape: Sequence[int], name: str) -> np.ndarray | None:
    """A parameter's gradient: None (no gradient yet) or a float array of the parameter's shape."""
    if grad is None:
        return None
    g = as_float_array(grad, name)
    check_shape(g, shape, name, "the shape of the parameter")
    return g


def check_shape(arr: np.ndarray, expected: Sequence[int], name: str, what: str) -> None:
    """Raise `ValueError` unless `arr.shape == expected`; `what` says why it must."""
    if tuple(arr.shape) != tuple(expected):
        raise ValueError(
            f"{name} must have shape {tuple(expected)} ({what}); got shape {tuple(arr.shape)}"
        )


def check_finite_real(value: Any, name: str) -> float:
    """A real, finite Python/numpy number (bools rejected) returned as float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {_describe(value)}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite; got {value!r}")
    return v


def check_eps(eps: Any, name: str = "eps") -> float:
    """eps must be a finite number > 0 (it keeps the square root away from zero)."""
    v = check_finite_real(eps, name)
    if v <= 0.0:
        raise ValueError(f"{name} must be > 0 (it keeps 1/sqrt(var + eps) finite); got {eps!r}")
    return v


def check_probability(p: Any, name: str, *, allow_one: bool = False) -> float:
    """A probability in [0, 1) (or [0, 1] with `allow_one`); NaN is rejected."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1); got {_describe(p)}")
    v = float(p)
    upper_ok = v <= 1.0 if allow_one else v < 1.0
    if not (v >= 0.0 and upper_ok):  # also False for NaN
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name} must be in {interval}; got {p!r}")
    return v


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """An integer (bools rejected), optionally at least `minimum`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {_describe(value)}")
    v = int(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {v}")
    return v


def check_generator(rng: Any, name: str = "rng") -> np.random.Generator:
    """Randomness is always passed in, as a `numpy.random.Generator`."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (e.g. numpy.random.default_rng(0)); "
            f"got {_describe(rng)}"
        )
    return rng


def native_dtype(dtype: Any) -> np.dtype:
    """`dtype` in the machine's byte order: `'>f8'` gives float64 on a little-endian host.

    Dtype decisions (`dt == np.float64`) are made on this, so an array read from a
    big-endian file is computed in the same precision as a native one; values keep their
    own byte order wherever they are written back.
    """
    dt = np.dtype(dtype)
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def check_bool(value: Any, name: str) -> bool:
    """A bool (Python or numpy); 0/1 and other truthy objects are rejected."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False); got {_describe(value)}")
    return bool(value)


def check_axis(axis: Any, ndim: int) -> int:
    """`axis` of an array of `ndim` dimensions as an int in [0, ndim) (negative counts from
    the end); TypeError for a non-int, ValueError out of range."""
    ax = check_int(axis, "axis")
    if not -ndim <= ax < ndim:
        raise ValueError(f"axis must be in [-{ndim}, {ndim}); got {axis}")
    return ax % ndim


def check_amax_epsilon(value: Any) -> float:
    """`amax_epsilon`, the amax lower bound of the scaled recipes: a finite real >= 0."""
    eps = check_finite_real(value, "amax_epsilon")
    if eps < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {value!r}")
    return eps


def scalar_item(value: Any, name: str, *, allow_one_element: bool = False) -> Any:
    """Unwrap a 0-d array (what `np.load` returns for a saved scalar) to a Python scalar.

    With `allow_one_element` an array of exactly one element (any shape) is unwrapped too;
    other arrays raise `ValueError`. Non-arrays are returned unchanged for the caller's own
    check (`check_finite_real`, `check_int`, `check_bool`).
    """
    if not isinstance(value, np.ndarray):
        return value
    if value.ndim == 0 or (allow_one_element and value.size == 1):
        return value.reshape(()).item()
    allowed = "a 1-element array" if allow_one_element else "a 0-d array"
    raise ValueError(f"{name} must be a scalar or {allowed}; got {_describe(value)}")


def check_nonneg(value: Any, name: str) -> float:
    """A finite real number >= 0 (a 0-d array is unwrapped), returned as float."""
    v = check_finite_real(scalar_item(value, name), name)
    if v < 0.0:
        raise ValueError(f"{name} must be >= 0; got {value!r}")
    return v


def check_positive(value: Any, name: str) -> float:
    """A finite real number > 0 (a 0-d array is unwrapped), returned as float."""
    v = check_finite_real(scalar_item(value, name), name)
    if v <= 0.0:
        raise ValueError(f"{name} must be > 0; got {value!r}")
    return v


def check_writeable(arr: Any, name: str, why: str = "it is updated in place") -> np.ndarray:
    """An ndarray that can be written in place; `why` says what writes it."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy ndarray ({why}); got {_describe(arr)}")
    if not arr.flags.writeable:
        raise ValueError(f"{name} must be writeable ({why}); got a read-only array of shape "
                         f"{arr.shape}")
    return arr


def check_out_tuple(out: Any, names: Sequence[str]) -> tuple[Any, ...] | None:
    """An `out=` of several results: None, or a tuple with one entry per name (each entry
    is then checked by `check_out`).

    Raises
    ------
    TypeError
        Not None and not a tuple of `len(names)`; the message lists the names.
    """
    if out is None:
        return None
    if not isinstance(out, tuple) or len(out) != len(names):
        raise TypeError(f"out must be None or a tuple of {len(names)} arrays or None "
                        f"({', '.join(names)}); got {type(out).__name__} {out!r}"[:200])
    return out


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, name: str = "out",
              inputs: Sequence[tuple[str, np.ndarray | None, bool]] = ()) -> np.ndarray | None:
    """An `out=` buffer: None, or a writeable C-contiguous ndarray of `shape` and `dtype`.

    `inputs` lists `(name, array, may_alias)`: `out` may be exactly the same memory as
    an input whose `may_alias` is True (an elementwise op reads each element before it
    writes it), and must not overlap any other input, nor an aliasable one partially.
    """
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy ndarray or None; got {_describe(out)}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)} (the result's dtype); got "
                        f"dtype {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (the result's shape); got "
                         f"shape {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; got strides {out.strides} for shape "
                         f"{out.shape} (pass np.empty(shape, dtype) or np.ascontiguousarray)")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable; got a read-only array of shape {out.shape}")
    for other, arr, may_alias in inputs:
        if arr is None or not np.shares_memory(out, arr):
            continue
        same = (may_alias and arr.shape == out.shape and arr.strides == out.strides
                and arr.__array_interface__["data"][0] == out.__array_interface__["data"][0])
        if not same:
            allowed = f"{other} itself (in place) or " if may_alias else ""
            raise ValueError(f"{name} overlaps {other}; pass {allowed}an array that shares "
                             f"no memory with {other}")
    return out


def check_mapping(value: Any, name: str, what: str = "a state dict") -> Any:
    """A mapping (dict-like), e.g. a state dict given to `load_state_dict`."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping ({what}); got {_describe(value)}")
    return value


def as_native(arr: np.ndarray) -> np.ndarray:
    """`arr` in native byte order: itself when it already is, else a native copy.

    Kernels and dtype decisions work on native arrays; a big-endian `'>f8'` input becomes
    a native float64 copy (same values), so it is computed in float64, never in float32.

    Examples
    --------
    >>> as_native(np.array([1.5], dtype=">f8")).dtype == np.float64
    True
    """
    dt = native_dtype(arr.dtype)
    return arr if dt == arr.dtype else arr.astype(dt)


_TINY: dict[np.dtype, float] = {}  # np.finfo(dtype).tiny per dtype (finfo costs ~2 us)


def check_eps_for(eps: float, dtype: Any, name: str = "eps") -> float:
    """eps (already checked by `check_eps`) must be a normal number of `dtype`.

    Below `np.finfo(dtype).tiny` (1.2e-38 for float32, 2.2e-308 for float64) eps is
    flushed or subnormal in the compute dtype and `1/sqrt(var + eps)` overflows for a
    constant row, so the result would not be finite.
    """
    tiny = _TINY.get(dtype) if isinstance(dtype, np.dtype) else None
    if tiny is None:
        tiny = _TINY.setdefault(np.dtype(dtype), float(np.finfo(dtype).tiny))
    if eps < tiny:
        raise ValueError(
            f"{name} must be >= {tiny:.3g} (the smallest normal {np.dtype(dtype).name}, the "
            f"compute dtype here) so that 1/sqrt(var + eps) stays finite; got {eps!r}"
        )
    return eps


def as_shape(value: Any, name: str = "normalized_shape") -> tuple[int, ...]:
    """An int or a sequence of ints >= 1 as a non-empty tuple."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        dims = tuple(check_int(d, f"{name}[{i}]", minimum=1) for i, d in enumerate(value))
        if not dims:
            raise ValueError(f"{name} must name at least one dimension; got {value!r}")
        return dims
    return (check_int(value, name, minimum=1),)


def check_trailing(x: np.ndarray, shape: tuple[int, ...], layer: str) -> None:
    """ValueError unless the trailing dims of x equal `shape` (a layer's normalized_shape)."""
    k = len(shape)
    if x.ndim < k or tuple(x.shape[x.ndim - k :]) != shape:
        raise ValueError(
            f"x must end with the dims {shape} ({layer} normalized_shape); got shape {x.shape}"
        )
