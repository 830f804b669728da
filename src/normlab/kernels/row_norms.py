"""LayerNorm / RMSNorm / add+norm kernels behind the functional API (dispatch adapters).

Each function here receives exactly the validated arguments of the NumPy reference's
private function (see `normlab.norms.layer_norm`, `rms_norm`, `add_norm`), returns
the same result types with the same cache classes, or `NotImplemented` for inputs it
does not serve: dtypes other than float32/float64, parameters or gradients of another dtype
than x (the reference then computes in the wider dtype), and empty arrays. So a kernel
forward pairs with a reference backward and vice versa.

Dimension letters: R rows (leading dims flattened), W width (normalised dims flattened),
K row chunks of the parameter-gradient reduction.

Layouts: the row kernels take C-contiguous (R, W) arrays; any other layout is copied with
`np.ascontiguousarray` first (one extra pass over the input, counted by the benchmark).
The cache keeps a reference to the caller's array, as the reference does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels import row_norms_jit as jit
from normlab.kernels._adapt import launch, reduce_chunks, rows_of, same_dtype, vec
from normlab.kernels.prefetch_jit import ahead_of
from normlab.norms._cache import LayerNormCache, RMSNormCache

__all__: list[str] = []  # the kernels are reached through normlab._backend only


def _grad_rows(dout: np.ndarray, x2: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(dout).reshape(x2.shape)  # (R, W)


_NO_RES = np.zeros((0, 0))


def _rows_into(dest: np.ndarray | None, r: int, w: int, dtype: np.dtype) -> np.ndarray:
    """The (R, W) array a kernel writes: a view of the validated `out=` buffer, or new."""
    return np.empty((r, w), dtype) if dest is None else dest.reshape(r, w)


def _shaped(dest: np.ndarray | None, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The caller's `out=` buffer itself when given, else the (R, W) result reshaped."""
    return rows.reshape(shape) if dest is None else dest


def _grads_into(dest: tuple[Any, ...] | None, *grads: np.ndarray | None) -> tuple[Any, ...]:
    """Parameter gradients copied into their `out=` buffers where given."""
    if dest is None:
        return grads
    return tuple(g if d is None or g is None else _copied(d, g) for d, g in zip(
        dest[1:], grads, strict=True))


def _copied(dest: np.ndarray, value: np.ndarray) -> np.ndarray:
    np.copyto(dest, value)
    return dest


def layer_norm_forward(
    x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float, k: int,
    dest: np.ndarray | None = None,
) -> Any:
    """Kernel of `_layer_norm_forward_ref`: one fused sweep per row (into `dest`)."""
    if not same_dtype(x, gamma, beta):
        return NotImplemented
    x2 = rows_of(x, k)  # (R, W)
    r, w = x2.shape
    out = _rows_into(dest, r, w, x.dtype)
    mean, rstd = np.empty(r, x.dtype), np.empty(r, x.dtype)  # (R,)
    g, b = vec(gamma, w, x.dtype, 1.0), vec(beta, w, x.dtype, 0.0)
    launch(jit.layer_norm_fwd, x2.size, x2, g, b, eps, out, mean, rstd, ahead_of(x2))
    lead = x.shape[: x.ndim - k]
    cache = LayerNormCache(x, gamma, beta, mean.reshape(lead), rstd.reshape(lead), eps, k)
    return (out.reshape(x.shape) if dest is None else dest), cache


def _ln_backward(dout: np.ndarray, dres: np.ndarray | None, cache: LayerNormCache,
                 dest: tuple[Any, ...] | None = None) -> Any:
    x, k = cache.x, cache.normalized_ndim
    if not same_dtype(x, dout, dres, cache.gamma, cache.beta, cache.mean, cache.rstd):
        return NotImplemented
    x2 = rows_of(x, k)  # (R, W)
    r, w = x2.shape
    kk = jit.chunk_count(r, w)
    pg, pb = np.empty((kk, w), x.dtype), np.empty((kk, w), x.dtype)  # (K, W) partial sums
    dx = _rows_into(None if dest is None else dest[0], r, w, x.dtype)
    res = _NO_RES.astype(x.dtype) if dres is None else _grad_rows(dres, x2)
    mean = np.ascontiguousarray(cache.mean).reshape(r)
    rstd = np.ascontiguousarray(cache.rstd).reshape(r)
    gamma = vec(cache.gamma, w, x.dtype, 1.0)
    dy = _grad_rows(dout, x2)  # (R, W)
    launch(jit.layer_norm_bwd, x2.size, dy, x2, mean, rstd, gamma, res, dx, pg, pb,
           ahead_of(x2))
    grads = _grads_into(dest, reduce_chunks(pg, cache.gamma), reduce_chunks(pb, cache.beta))
    return (dx.reshape(x.shape) if dest is None or dest[0] is None else dest[0]), *grads


def layer_norm_backward(
    dout: np.ndarray, cache: LayerNormCache, dest: tuple[Any, ...] | None = None
) -> Any:
    """Kernel of `_layer_norm_backward_ref`: both row sums in one sweep, then dx.

    `dest` (validated `out=` buffers): dx is written in place (it may be dout: each
    dout element is read before its dx element is written); parameter gradients are
    reduced, then copied in.
    """
    return _ln_backward(dout, None, cache, dest)


def add_layer_norm_backward(
    dout: np.ndarray, dresidual: np.ndarray | None, cache: LayerNormCache,
    dest: tuple[Any, ...] | None = None,
) -> Any:
    """Kernel of `_add_layer_norm_backward_ref`: dresidual added in the dx sweep.

    `dest`: as for LayerNorm's backward (dx never overlaps dresidual: validated).
    """
    return _ln_backward(dout, dresidual, cache, dest)


def rms_norm_forward(
    x: np.ndarray, weight: np.ndarray | None, eps: float, offset: float, k: int,
    dest: np.ndarray | None = None,
) -> Any:
    """Kernel of `_rms_norm_forward_ref` (gain = offset + weight), into `dest`."""
    if not same_dtype(x, weight):
        return NotImplemented
    x2 = rows_of(x, k)  # (R, W)
    r, w = x2.shape
    out, rstd = _rows_into(dest, r, w, x.dtype), np.empty(r, x.dtype)
    launch(jit.rms_norm_fwd, x2.size, x2, _gain(weight, offset, w, x.dtype), eps, out, rstd,
           ahead_of(x2))
    cache = RMSNormCache(x, weight, rstd.reshape(x.shape[: x.ndim - k]), eps, offset, k)
    return (out.reshape(x.shape) if dest is None else dest), cache


def _gain(weight: np.ndarray | None, offset: float, w: int, dtype: np.dtype) -> np.ndarray:
    """offset + weight as (W,) in x's dtype; ones when there is no weight."""
    g = vec(weight, w, dtype, 1.0)
    return (g + offset).astype(dtype) if (weight is not None and offset != 0.0) else g


def _rms_backward(dout: np.ndarray, dres: np.ndarray | None, cache: RMSNormCache,
                  dest: tuple[Any, ...] | None = None) -> Any:
    x, k = cache.x, cache.normalized_ndim
    if not same_dtype(x, dout, dres, cache.weight, cache.rstd):
        return NotImplemented
    x2 = rows_of(x, k)  # (R, W)
    r, w = x2.shape
    pg = np.empty((jit.chunk_count(r, w), w), x.dtype)  # (K, W) partial sums
    dx = _rows_into(None if dest is None else dest[0], r, w, x.dtype)
    res = _NO_RES.astype(x.dtype) if dres is None else _grad_rows(dres, x2)
    gain = _gain(cache.weight, cache.offset, w, x.dtype)
    rstd = np.ascontiguousarray(cache.rstd).reshape(r)
    launch(jit.rms_norm_bwd, x2.size, _grad_rows(dout, x2), x2, rstd, gain, res, dx, pg,
           ahead_of(x2))
    grads = _grads_into(dest, reduce_chunks(pg, cache.weight))
    return (dx.reshape(x.shape) if dest is None or dest[0] is None else dest[0]), *grads


def rms_norm_backward(
    dout: np.ndarray, cache: RMSNormCache, dest: tuple[Any, ...] | None = None
) -> Any:
    """Kernel of `_rms_norm_backward_ref` (`dest`: as for LayerNorm's backward)."""
    return _rms_backward(dout, None, cache, dest)


def add_rms_norm_backward(
    dout: np.ndarray, dresidual: np.ndarray | None, cache: RMSNormCache,
    dest: tuple[Any, ...] | None = None,
) -> Any:
    """Kernel of `_add_rms_norm_backward_ref` (`dest`: as for the LayerNorm one)."""
    return _rms_backward(dout, dresidual, cache, dest)


def add_layer_norm_forward(
    x: np.ndarray,
    residual: np.ndarray,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    eps: float,
    k: int,
    dest: tuple[Any, ...] = (None, None),
) -> Any:
    """Kernel of `_add_layer_norm_forward_ref`: the sum and its norm in one sweep.

    `dest` (validated `out=` buffers): written in place; either may be x or residual
    (row r of x and residual is read into s before row r of out is written).
    """
    if not same_dtype(x, residual, gamma, beta):
        return NotImplemented
    x2, res2 = rows_of(x, k), rows_of(residual, k)  # (R, W)
    r, w = x2.shape
    s, out = _rows_into(dest[1], r, w, x.dtype), _rows_into(dest[0], r, w, x.dtype)
    mean, rstd = np.empty(r, x.dtype), np.empty(r, x.dtype)
    g, b = vec(gamma, w, x.dtype, 1.0), vec(beta, w, x.dtype, 0.0)
    launch(jit.add_layer_norm_fwd, x2.size, x2, res2, g, b, eps, s, out, mean, rstd)
    lead = x.shape[: x.ndim - k]
    s = _shaped(dest[1], s, x.shape)
    cache = LayerNormCache(s, gamma, beta, mean.reshape(lead), rstd.reshape(lead), eps, k)
    return _shaped(dest[0], out, x.shape), s, cache


def add_rms_norm_forward(
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray | None,
    eps: float,
    offset: float,
    k: int,
    dest: tuple[Any, ...] = (None, None),
) -> Any:
    """Kernel of `_add_rms_norm_forward_ref` (`dest`: as for the LayerNorm one)."""
    if not same_dtype(x, residual, weight):
        return NotImplemented
    x2, res2 = rows_of(x, k), rows_of(residual, k)  # (R, W)
    r, w = x2.shape
    s, out = _rows_into(dest[1], r, w, x.dtype), _rows_into(dest[0], r, w, x.dtype)
    rstd = np.empty(r, x.dtype)  # (R,)
    gain = _gain(weight, offset, w, x.dtype)  # (W,)
    launch(jit.add_rms_norm_fwd, x2.size, x2, res2, gain, eps, s, out, rstd)
    s = _shaped(dest[1], s, x.shape)
    cache = RMSNormCache(s, weight, rstd.reshape(x.shape[: x.ndim - k]), eps, offset, k)
    return _shaped(dest[0], out, x.shape), s, cache
