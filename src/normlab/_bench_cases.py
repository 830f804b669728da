"""The benchmark's cases: each builds its arrays, checks correctness, then times the calls.

Contract: ``bench_*(name_or_fmt, shape, ctx)`` returns one row for :mod:`normlab.bench`'s
table (see :mod:`normlab._bench_table` for the fields). ``ctx`` holds ``rng`` (a
Generator), ``budget`` (seconds per timed op), ``kernels`` (bool), ``torch`` (the module
or None), ``bandwidth`` (bytes/s of a hot copy), ``page_cost`` (s/byte of zero-filling a
new output) and ``ref_values`` (values the slow NumPy reference quantize is timed on).
Correctness is checked before timing: norms within 16 eps32 sqrt(W) max|ref| of the
float64 reference, quantize bit for bit against the NumPy reference, ``out=`` rows equal to
their new-array results.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import normlab as nl
from normlab import _backend
from normlab._timing import measure
from normlab.precision import quantize

__all__ = ["SMALL_SHAPES", "bench_norm", "bench_norm_out", "bench_quantize",
           "bench_quantize_out"]

SMALL_SHAPES = ((8, 64), (64, 512))  # the lab's training loops and most nn use live here
_EPS32 = float(np.finfo(np.float32).eps)


def _norm_case(name: str, shape: tuple[int, int], rng: np.random.Generator) -> dict[str, Any]:
    x = (rng.standard_normal(shape, dtype=np.float32) * 2 + 3).astype(np.float32)
    dy = rng.standard_normal(shape, dtype=np.float32)
    g = rng.standard_normal(shape[1], dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)

    def fwd(a: np.ndarray, gg: np.ndarray) -> Any:
        if name == "layer_norm":
            return nl.layer_norm_forward(a, gg, b.astype(a.dtype, copy=False))
        return nl.rms_norm_forward(a, gg)

    bwd = nl.layer_norm_backward if name == "layer_norm" else nl.rms_norm_backward
    return {"x": x, "dy": dy, "g": g, "b": b, "fwd": fwd, "bwd": bwd}


def _check_norm(case: dict[str, Any]) -> dict[str, float]:
    """Max error of the kernel vs the float64 reference, in units of the stated tolerance.

    Tolerance: 16 * eps32 * sqrt(width) * max|reference| per output (a few float32 ulp
    per term of a row reduction, random-walk growth over the width).
    """
    x, dy, g, fwd, bwd = case["x"], case["dy"], case["g"], case["fwd"], case["bwd"]
    out, cache = fwd(x, g)
    got = (out, *bwd(dy, cache))
    del cache
    with _backend.use_backend("numpy"):
        ro, rc = fwd(x.astype(np.float64), g.astype(np.float64))
        ref = (ro, *bwd(dy.astype(np.float64), rc))
    tol = 16 * _EPS32 * np.sqrt(x.shape[1])
    names = ("out", "dx", "dgamma", "dbeta")
    return {
        n: float(np.max(np.abs(a - r)) / (tol * np.max(np.abs(r))))
        for n, a, r in zip(names, got, ref, strict=False)
        if a is not None
    }


def _torch_norm(torch: Any, name: str, case: dict[str, Any]) -> Callable[[], Any]:
    tx = torch.from_numpy(case["x"]).requires_grad_()
    tg = torch.from_numpy(case["g"]).requires_grad_()
    tb = torch.from_numpy(case["b"]).requires_grad_()
    tdy = torch.from_numpy(case["dy"])
    w = case["x"].shape[1]
    functional = torch.nn.functional

    def run() -> None:
        if name == "layer_norm":
            y = functional.layer_norm(tx, (w,), tg, tb, 1e-5)
        else:
            y = functional.rms_norm(tx, (w,), tg, 1e-8)
        y.backward(tdy)
        tx.grad = tg.grad = tb.grad = None

    return run


def _peak_extra(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated (NumPy buffers are traced) while ``fn`` runs, outputs included."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak


def _time(row: dict[str, Any], who: str, fn: Callable[[], Any], ctx: dict[str, Any],
          slow: bool = False) -> None:
    """Time ``fn`` until its median is stable; store median, min, spread under ``who``."""
    budget = ctx["budget"] / 2 if slow else ctx["budget"]
    row.update(measure(fn, budget_s=budget, batch=3 if slow else 5).as_dict(who))


def bench_norm(name: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    case = _norm_case(name, shape, ctx["rng"])
    x, dy, g = case["x"], case["dy"], case["g"]
    small = shape in SMALL_SHAPES  # cache-resident: per-call overhead, no bandwidth bound

    def fwd_bwd() -> Any:
        out, cache = case["fwd"](x, g)
        return out, case["bwd"](dy, cache)

    row: dict[str, Any] = {"op": f"{name} fwd+bwd", "shape": list(shape)}
    if ctx["kernels"]:
        row["check"] = _check_norm(case)
        _time(row, "normlab", fwd_bwd, ctx)
        if not small:
            row["normlab_peak_extra_bytes"] = _peak_extra(fwd_bwd)
    with _backend.use_backend("numpy"):
        _time(row, "numpy", fwd_bwd, ctx, slow=True)
        if not small:
            row["numpy_peak_extra_bytes"] = _peak_extra(fwd_bwd)
    row["outputs_bytes"] = 2 * x.nbytes  # out and dx: what the caller keeps
    if ctx["torch"] is not None:
        _time(row, "torch", _torch_norm(ctx["torch"], name, case), ctx)
    if not small:
        row["bound_s"] = 5 * x.nbytes / ctx["bandwidth"]
        row["bound_alloc_s"] = row["bound_s"] + 2 * x.nbytes * ctx["page_cost"]  # new out, dx
    return row


def bench_norm_out(name: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    """fwd+bwd into preallocated ``out=`` buffers: no page zero-fill, so the plain bound."""
    case = _norm_case(name, shape, ctx["rng"])
    x, dy, g, b = case["x"], case["dy"], case["g"], case["b"]
    y, dx, dg, db = np.empty_like(x), np.empty_like(x), np.empty_like(g), np.empty_like(b)
    if name == "layer_norm":
        def fwd_bwd() -> Any:
            _, cache = nl.layer_norm_forward(x, g, b, out=y)
            return nl.layer_norm_backward(dy, cache, out=(dx, dg, db))
    else:
        def fwd_bwd() -> Any:
            _, cache = nl.rms_norm_forward(x, g, out=y)
            return nl.rms_norm_backward(dy, cache, out=(dx, dg))
    row: dict[str, Any] = {"op": f"{name} fwd+bwd out=", "shape": list(shape)}
    if ctx["kernels"]:
        fwd_bwd()
        out, cache = case["fwd"](x, g)
        same = np.array_equal(y, out) and np.array_equal(dx, case["bwd"](dy, cache)[0])
        row["check"] = {"same_as_new_arrays": bool(same)}
        _time(row, "normlab", fwd_bwd, ctx)
    row["bound_s"] = row["bound_alloc_s"] = 5 * x.nbytes / ctx["bandwidth"]
    return row


def bench_quantize_out(fmt: str, shape: tuple[int, int], ctx: dict[str, Any]
                        ) -> dict[str, Any]:
    """quantize into a preallocated ``out=`` buffer (2 passes over memory, nothing new)."""
    x = ctx["rng"].standard_normal(shape, dtype=np.float32) * 4
    buf = np.empty_like(x)
    row: dict[str, Any] = {"op": f"quantize {fmt} nearest out=", "shape": list(shape)}
    if ctx["kernels"]:
        same = np.array_equal(quantize(x, fmt, out=buf).view(np.uint32),
                              quantize(x, fmt).view(np.uint32))
        row["check"] = {"same_as_new_array": bool(same)}
        _time(row, "normlab", lambda: quantize(x, fmt, out=buf), ctx)
    row["bound_s"] = row["bound_alloc_s"] = 2 * x.nbytes / ctx["bandwidth"]
    return row


def bench_quantize(fmt: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    """Kernel and ml_dtypes on the whole array; the (slow) NumPy reference on a block of
    leading rows (about 2^20 values, 2^16 with --quick), checked bit for bit against the
    kernel on that block and its time scaled to the whole array (``numpy_rows``: rows)."""
    x = ctx["rng"].standard_normal(shape, dtype=np.float32) * 4
    sub = x[: max(1, min(shape[0], ctx["ref_values"] // shape[1]))]  # (r, W) leading rows
    mld = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[fmt]
    row: dict[str, Any] = {"op": f"quantize {fmt} nearest", "shape": list(shape),
                           "numpy_rows": sub.shape[0]}
    with _backend.use_backend("numpy"):
        ref = quantize(sub, fmt)
        _time(row, "numpy", lambda: quantize(sub, fmt), ctx, slow=True)
        for key in ("numpy_s", "numpy_min_s"):
            row[key] *= shape[0] / sub.shape[0]
    if ctx["kernels"]:
        same = np.array_equal(quantize(sub, fmt).view(np.uint32), ref.view(np.uint32))
        row["check"] = {"bit_identical": bool(same)}
        _time(row, "normlab", lambda: quantize(x, fmt), ctx)
    _time(row, "ml_dtypes", lambda: x.astype(mld).astype(np.float32), ctx)
    row["bound_s"] = 2 * x.nbytes / ctx["bandwidth"]
    row["bound_alloc_s"] = row["bound_s"] + x.nbytes * ctx["page_cost"]  # the result is new
    return row
