"""Validation, dtype and dispatch helpers shared by the functional norms.

Every public norm validates its inputs with these helpers (built on
`normlab._validate`) before touching any state, so a rejected call changes nothing.
The public functions end in `dispatch_forward` / `dispatch_backward`: the `out=` check,
then the registered kernel or the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from normlab._backend import dispatch
from normlab._validate import (
    as_float_array,
    as_native,
    check_eps_for,
    check_int,
    check_shape,
    compute_dtype,
)
from normlab.norms._out import backward_out, forward_out, seam_extra

__all__ = [
    "check_cache",
    "check_dout",
    "check_dresidual",
    "check_eps_range",
    "check_input",
    "check_param",
    "check_params",
    "check_trailing_params",
    "compute_dtype_of",
    "dispatch",
    "dispatch_backward",
    "dispatch_forward",
    "resolve_normalized_ndim",
    "trailing_dims_why",
]


_F32, _F64 = compute_dtype(np.float32), compute_dtype(np.float64)


def compute_dtype_of(*arrays: np.ndarray | None) -> np.dtype:
    """float64 when any given array is float64 (or wider), else float32."""
    for a in arrays:  # compute_dtype gives only float32 or float64: any float64 wins
        if a is not None and compute_dtype(a.dtype) == _F64:
            return _F64
    return _F32


def check_param(
    value: Any, name: str, shape: tuple[int, ...], what: str | Callable[[], str]
) -> np.ndarray | None:
    """None passes through; otherwise a float array of exactly `shape`.

    `what` (why the shape is required) may be a callable: it is then only formatted when
    the check fails, which keeps a small call's validation cheap.
    """
    if value is None:
        return None
    arr = as_native(as_float_array(value, name))
    if arr.shape != shape:
        check_shape(arr, shape, name, what() if callable(what) else what)
    return arr


def check_params(
    x: np.ndarray, eps: float, shape: tuple[int, ...], what: str | Callable[[], str],
    **params: Any,
) -> tuple[Any, ...]:
    """Each parameter (name=value, in order) through `check_param` against `shape`, then
    eps against the compute dtype of x and them (`check_eps_range`): `(*params, eps)`."""
    arrays = [check_param(value, name, shape, what) for name, value in params.items()]
    return (*arrays, check_eps_range(eps, x, *arrays))


def check_trailing_params(
    x: np.ndarray, eps: float, normalized_ndim: Any, **params: Any
) -> tuple[Any, ...]:
    """k (`resolve_normalized_ndim`, from the parameters in order), then `check_params`
    for parameters of shape F = `x.shape[-k:]`: `(k, *params, eps)`."""
    k = resolve_normalized_ndim(x, normalized_ndim, *params.values(), names=tuple(params))
    feat = tuple(x.shape[x.ndim - k :])
    return (k, *check_params(x, eps, feat, trailing_dims_why(x, k), **params))


def trailing_dims_why(x: np.ndarray, k: int) -> Callable[[], str]:
    """The reason a norm's parameter has shape `x.shape[-k:]`, formatted on demand."""
    return lambda: f"the {k} normalised trailing dim(s) of x, x.shape = {x.shape}"


def resolve_normalized_ndim(
    x: np.ndarray,
    normalized_ndim: Any,
    *params: Any,
    names: tuple[str, ...] = ("gamma", "beta"),
) -> int:
    """The number k of trailing dims to normalise.

    Explicit `normalized_ndim` wins; else the ndim of the first parameter that is given
    (`params` in order, called `names` in messages); else 1. k must be in [1, x.ndim].
    """
    source = "normalized_ndim"
    if normalized_ndim is None:
        given = [(name, p) for name, p in zip(names, params, strict=False)
                 if p is not None]
        # converted first, so a ragged list is reported under its own name
        source, k = ((f"{given[0][0]}.ndim", as_float_array(given[0][1], given[0][0]).ndim)
                     if given else ("default", 1))
        if k < 1:
            raise ValueError(
                f"{given[0][0]} must have at least one dimension (it covers the normalised "
                f"trailing dims of x); got a {k}-d array"
            )
    else:
        k = check_int(normalized_ndim, "normalized_ndim", minimum=1)
    if k > x.ndim:
        raise ValueError(
            f"normalized_ndim ({source}) must be <= x.ndim = {x.ndim} (it counts trailing "
            f"dims of x of shape {x.shape}); got {k}"
        )
    return k


def check_dout(dout: Any, x: np.ndarray, name: str = "dout") -> np.ndarray:
    """The upstream gradient: a float array of exactly x's shape."""
    arr = as_native(as_float_array(dout, name))
    check_shape(arr, x.shape, name, "the shape of the forward input x")
    return arr


def check_cache(cache: Any, cls: type, producer: str) -> Any:
    """The cache must be a `cls` returned by `producer` (the matching forward)."""
    if not isinstance(cache, cls):
        raise TypeError(
            f"cache must be the {cls.__name__} returned by {producer}; got {type(cache).__name__}"
        )
    return cache


def check_input(x: Any, name: str = "x", *, min_ndim: int = 1) -> np.ndarray:
    """A float array of at least `min_ndim` dims in native byte order ('>f8' -> float64)."""
    return as_native(as_float_array(x, name, min_ndim=min_ndim))


def check_eps_range(eps: float, *arrays: np.ndarray | None) -> float:
    """eps must be a normal number of the compute dtype of `arrays` (see check_eps_for)."""
    return check_eps_for(eps, compute_dtype_of(*arrays))


def check_dresidual(dresidual: Any, x: np.ndarray) -> np.ndarray | None:
    """The add + norm backwards' gradient on `new_residual`: None, or a float array of its
    shape (`x`, the new residual kept by the cache)."""
    if dresidual is None:
        return None
    arr = check_input(dresidual, "dresidual", min_ndim=0)
    check_shape(arr, x.shape, "dresidual", "the shape of new_residual")
    return arr


def dispatch_forward(
    op: str, ref: Callable[..., Any], args: tuple[Any, ...], out: Any, **params: Any
) -> Any:
    """Run a forward on its validated `args` (x first): the `out=` buffer is checked
    against x and the named `params` (arrays it must not overlap), then the kernel
    registered as `op` runs, or the reference `ref` (the buffer as a last argument)."""
    dest = forward_out(out, args[0], tuple(params.items()))
    return dispatch(op, ref, *args, *seam_extra(dest))


def dispatch_backward(
    op: str, ref: Callable[..., Any], dout: Any, cache: Any, out: Any, cls: type,
    params: tuple[str, ...], *, residual: tuple[Any, ...] = (),
) -> Any:
    """Check a backward's arguments and run it.

    The cache must be a `cls` (from the forward named like `op`), dout of x's shape, the
    optional `residual` = `(dresidual,)` (the add + norm backwards) of the new residual's
    shape, and `out=` a tuple `(dx, d<param> for each name in params)`. Then the kernel
    registered as `op` runs, or `ref(dout, *residual, cache[, dest])`.
    """
    cache = check_cache(cache, cls, op.replace("_backward", "_forward"))
    dout = check_dout(dout, cache.x)
    extra = tuple(check_dresidual(d, cache.x) for d in residual)
    grads = tuple((f"d{name}", getattr(cache, name)) for name in params)
    dest = backward_out(out, dout, cache.x, grads, *extra)
    return dispatch(op, ref, dout, *extra, cache, *seam_extra(dest))
