"""The array namespace that recipe arithmetic is written against: NumPy here, torch in torch/.

Every piece of recipe arithmetic
([scale_from_amax][normlab.precision.scaled.scales.scale_from_amax], the delayed update, MX
exponents, NVFP4 and blockwise scales, block tiling) is one function that takes its arrays and
the namespace `xp` of those arrays, and calls only Python operators (`+ - * / & >> == <`,
indexing, `.shape`) and the methods below. The same body then runs on NumPy arrays
([NUMPY][normlab.precision.scaled.namespace.NUMPY]) and on torch tensors on any device
(`normlab.torch.namespace.TORCH`, registered when `normlab.torch` is imported), and traces under
`torch.compile` as one graph: no method reads a value back to the host or branches on one.

Why not the array API standard (`array-api-compat`, as gfloat uses): recipe arithmetic
needs bit views (power-of-two scales, the MX round-up rule), zero padding, and each
backend's own exact rounding engine, none of which the standard has, and a core
dependency for the rest is not worth it.

Two rules keep the NumPy and torch results bit-identical. Constants enter as typed 0-d
arrays ([scalar][normlab.precision.scaled.namespace.ArrayNamespace.scalar]), never as Python
floats (NumPy 1.x would widen a float32 expression to float64, and torch evaluates
`python_float / tensor` as a reciprocal times the float). Every operation is an IEEE
operation of the stated dtype, correctly rounded on every device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from normlab import _backend

__all__ = ["NUMPY", "ArrayNamespace", "namespace_of", "register_namespace"]

F32_MAX = float(np.finfo(np.float32).max)
"""float32's largest finite value, `0x1.fffffep+127` (3.4028235e38)."""


class ArrayNamespace:
    """The operations recipe arithmetic uses beyond Python operators (NumPy arrays here).

    Dtypes are named by strings: `"float32"`, `"float64"`, `"int16"`, `"int32"`, `"int64"`,
    `"uint8"`, `"bool"`.
    Elementwise functions, shapes, reductions and bit views call the array library `lib`,
    whose names NumPy and torch share; a subclass for another library sets `lib` and
    overrides the methods whose spelling differs (see `normlab.torch.namespace`).

    Attributes
    ----------
    name : str
        `"numpy"` here.
    lib : module
        The array library (`numpy` here).
    """

    name = "numpy"
    lib: Any = np
    _DTYPES: ClassVar[dict[str, Any]] = {
        "float32": np.float32, "float64": np.float64, "int16": np.int16, "int32": np.int32,
        "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}

    # --- dtypes and constants (spelled per library) -------------------------------------
    def astype(self, x: Any, dtype: str) -> Any:
        """`x` cast to `dtype` (round to nearest even when narrowing)."""
        return np.asarray(x).astype(self._DTYPES[dtype])

    def cast_like(self, x: Any, like: Any) -> Any:
        """`x` cast to `like`'s dtype."""
        return np.asarray(x).astype(np.asarray(like).dtype, copy=False)

    def work(self, x: Any) -> Any:
        """`x` widened exactly to its work dtype: float64 for float64, else float32."""
        arr = np.asarray(x)
        wide = arr.dtype.kind == "f" and arr.dtype.itemsize >= 8
        return arr.astype(np.float64 if wide else np.float32, copy=False)

    def scalar(self, value: float, like: Any, dtype: str | None = None) -> Any:
        """A 0-d array holding `value` in `dtype` (default: `like`'s dtype)."""
        dt = np.asarray(like).dtype if dtype is None else self._DTYPES[dtype]
        with np.errstate(over="ignore"):
            return np.asarray(value, dtype=dt)

    def full(self, shape: Sequence[int], value: float, like: Any,
             dtype: str | None = None) -> Any:
        """An array of `shape` filled with `value` (`like`'s dtype by default)."""
        dt = np.asarray(like).dtype if dtype is None else self._DTYPES[dtype]
        return np.full(tuple(shape), value, dtype=dt)

    def arange(self, n: int, like: Any) -> Any:
        """The int64 indices 0, 1, ..., n - 1 (on `like`'s device)."""
        return np.arange(n, dtype=np.int64)

    def input_max(self, x: Any) -> float:
        """The largest finite value of `x`'s dtype for 16-bit floats, else float32's."""
        dt = np.asarray(x).dtype
        if dt.itemsize == 2 and dt.kind in "fV":  # float16, ml_dtypes.bfloat16
            return float(ml_dtypes.finfo(dt).max)
        return F32_MAX

    def is_float64(self, x: Any) -> bool:
        """Whether `x` holds float64 (a dtype fact, known before any value is read)."""
        return bool(np.asarray(x).dtype == np.float64)

    def take(self, x: Any, indices: Any, axis: int) -> Any:
        """`x`'s entries at `indices` along `axis` (a gather)."""
        return np.take(x, indices, axis=axis)

    def pad_end(self, x: Any, widths: Sequence[int]) -> Any:
        """`x` with `widths[i]` zeros appended to axis `i` (`x` itself when all are 0)."""
        if not any(widths):
            return x
        return np.pad(x, [(0, int(w)) for w in widths])

    def constant(self, table: np.ndarray, like: Any) -> Any:
        """A NumPy `table` (a lookup table of constants) as an array beside `like`."""
        return table

    def searchsorted(self, sorted_values: Any, x: Any) -> Any:
        """The int64 index of the first entry of 1-D `sorted_values` that is `>= x`."""
        return np.searchsorted(sorted_values, x).astype(np.int64)

    def ordered(self, x: Any, order: str) -> Any:
        """2-D `x` with its rows (`order="C"`) or its columns (`"F"`) contiguous."""
        return np.asfortranarray(x) if order == "F" else np.ascontiguousarray(x)

    # --- the same spelling in NumPy and torch -------------------------------------------
    def bits32(self, x: Any) -> Any:
        """The bits of float32 `x` as int32."""
        return self.astype(x, "float32").view(self._DTYPES["int32"])

    def from_bits32(self, b: Any) -> Any:
        """float32 values from int32 bits."""
        return self.astype(b, "int32").view(self._DTYPES["float32"])

    def bits64(self, x: Any) -> Any:
        """The bits of float64 `x` as int64."""
        return self.astype(x, "float64").view(self._DTYPES["int64"])

    def from_bits64(self, b: Any) -> Any:
        """float64 values from int64 bits."""
        return self.astype(b, "int64").view(self._DTYPES["float64"])

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """`a` where `cond`, else `b` (arrays of one dtype)."""
        return self.lib.where(cond, a, b)

    def isnan(self, x: Any) -> Any:
        """Elementwise NaN test."""
        return self.lib.isnan(x)

    def isinf(self, x: Any) -> Any:
        """Elementwise infinity test."""
        return self.lib.isinf(x)

    def isfinite(self, x: Any) -> Any:
        """Elementwise finiteness test."""
        return self.lib.isfinite(x)

    def abs(self, x: Any) -> Any:
        """Elementwise magnitude."""
        return self.lib.abs(x)

    def maximum(self, a: Any, b: Any) -> Any:
        """Elementwise maximum; a NaN in either argument gives NaN."""
        return self.lib.maximum(a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        """Elementwise minimum; a NaN in either argument gives NaN."""
        return self.lib.minimum(a, b)

    def reshape(self, x: Any, shape: Sequence[int]) -> Any:
        """`x` with another shape (a view where the layout allows)."""
        return x.reshape(tuple(shape))

    def moveaxis(self, x: Any, source: int, destination: int) -> Any:
        """`x` with axis `source` moved to `destination` (a view)."""
        return self.lib.moveaxis(x, source, destination)

    def concat(self, arrays: Sequence[Any], axis: int) -> Any:
        """The arrays joined along `axis`."""
        return self.lib.concatenate(list(arrays), axis=axis)

    def max(self, x: Any, axis: int | tuple[int, ...]) -> Any:
        """The maximum over `axis`; a NaN anywhere gives NaN."""
        return self.lib.amax(x, axis)

    # --- engines ------------------------------------------------------------------------
    def quantize(self, x: Any, fmt: Any, *, saturate: bool, rounding: str = "nearest",
                 seed: int | None = None, random_bits: Any = None) -> Any:
        """This backend's exact rounding engine ([quantize][normlab.precision.quantize])."""
        from normlab.precision.formats.rounding import quantize

        return quantize(x, fmt, saturate=saturate, rounding=rounding, seed=seed,
                        random_bits=random_bits)

    def dispatch(self, name: str, reference: Callable[..., Any], *args: Any) -> Any:
        """`reference(*args)`, or the numba kernel `name` where one serves the arguments."""
        return _backend.dispatch(name, reference, *args)

    def quiet(self) -> contextlib.AbstractContextManager[Any]:
        """A context that silences NumPy's floating-point warnings (an overflow to inf is
        handled by the arithmetic that follows it)."""
        return np.errstate(all="ignore")


NUMPY = ArrayNamespace()
"""The NumPy namespace."""

_NAMESPACES: list[tuple[type, ArrayNamespace]] = [(np.ndarray, NUMPY), (np.generic, NUMPY)]


def register_namespace(array_type: type, namespace: ArrayNamespace) -> None:
    """Make `namespace` the one [namespace_of][normlab.precision.scaled.namespace.namespace_of]
    returns for instances of `array_type` (`normlab.torch` registers `torch.Tensor`).

    Parameters
    ----------
    array_type : type
        The array class.
    namespace : ArrayNamespace
        Its namespace.
    """
    _NAMESPACES.insert(0, (array_type, namespace))


def namespace_of(x: Any) -> ArrayNamespace:
    """The namespace of array `x` (Python numbers count as NumPy).

    Parameters
    ----------
    x : array or number
        A NumPy array or scalar, a Python number, or an array of a registered library.

    Returns
    -------
    xp : ArrayNamespace
        Its namespace.

    Raises
    ------
    TypeError
        If `x` is of no registered array type (a torch tensor before `normlab.torch` is
        imported, for instance).

    Examples
    --------
    >>> namespace_of(np.zeros(2)) is NUMPY
    True
    """
    if isinstance(x, (int, float)):
        return NUMPY
    for array_type, namespace in _NAMESPACES:
        if isinstance(x, array_type):
            return namespace
    raise TypeError(f"no array namespace for {type(x).__name__}; pass a NumPy array (or "
                    "import normlab.torch first for torch tensors)")
