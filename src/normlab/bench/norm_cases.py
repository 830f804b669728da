r"""The benchmark's LayerNorm and RMSNorm cases: forward + backward, with and without `out=`.

Contract: `bench_*(name, shape, ctx)` builds its arrays, checks correctness, then times
the calls, and returns one row of the table (fields in [normlab.bench.table][]). `ctx`
holds `rng` (a Generator), `budget` (seconds per timed op), `kernels` (bool), `torch` (the
module or None), `bandwidth` (bytes/s of a hot copy), `page_cost` (s/byte of zero-filling
a new output) and `ref_values` (values the slow NumPy reference quantize is timed on).
Correctness is checked before timing: norms within $16 \epsilon_{32} \sqrt{W} \max|ref|$ of
the float64 reference, `out=` rows equal to their new-array results. Bytes that must move:
the forward reads x and writes out, the backward reads x and dout and writes dx (5 arrays).
The `out=` rows are timed in alternation with the all-core copy of x, their bound taken
from the copies of the same rounds.
Compared with `torch.nn.functional.layer_norm` / `rms_norm` plus autograd backward when
PyTorch is installed (imported by the caller; the library itself never imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import normlab as nl
from normlab import _backend
from normlab.bench.bandwidth import against_copy
from normlab.bench.memory import peak_extra
from normlab.bench.timing import time_into

__all__ = ["SMALL_SHAPES", "bench_norm", "bench_norm_out"]

SMALL_SHAPES = ((8, 64), (64, 512))
"""Cache-resident shapes (the lab's training loops and most `nn` use live here): the time
per call is overhead (validation, dispatch, allocation), so these rows have no bound."""
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


def bench_norm(name: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    """Forward + backward returning new arrays: kernel, NumPy reference and PyTorch.

    The small shapes of `SMALL_SHAPES` get no bound and no peak-memory measure.

    Parameters
    ----------
    name : str
        "layer_norm" or "rms_norm".
    shape : tuple of int
        (R, W), float32.
    ctx : dict
        The run's context (see the module docstring).

    Returns
    -------
    row : dict
        One row of the table: `op`, `shape`, `check`, timings, bounds.
    """
    case = _norm_case(name, shape, ctx["rng"])
    x, dy, g = case["x"], case["dy"], case["g"]
    small = shape in SMALL_SHAPES  # cache-resident: per-call overhead, no bandwidth bound

    def fwd_bwd() -> Any:
        out, cache = case["fwd"](x, g)
        return out, case["bwd"](dy, cache)

    row: dict[str, Any] = {"op": f"{name} fwd+bwd", "shape": list(shape)}
    if ctx["kernels"]:
        row["check"] = _check_norm(case)
        time_into(row, "normlab", fwd_bwd, ctx["budget"])
        if not small:
            row["normlab_peak_extra_bytes"] = peak_extra(fwd_bwd)
    with _backend.use_backend("numpy"):
        time_into(row, "numpy", fwd_bwd, ctx["budget"], slow=True)
        if not small:
            row["numpy_peak_extra_bytes"] = peak_extra(fwd_bwd)
    row["outputs_bytes"] = 2 * x.nbytes  # out and dx: what the caller keeps
    if ctx["torch"] is not None:
        time_into(row, "torch", _torch_norm(ctx["torch"], name, case), ctx["budget"])
    if not small:
        row["bound_s"] = 5 * x.nbytes / ctx["bandwidth"]
        row["bound_alloc_s"] = row["bound_s"] + 2 * x.nbytes * ctx["page_cost"]  # new out, dx
    return row


def bench_norm_out(name: str, shape: tuple[int, int], ctx: dict[str, Any],
                   forward_only: bool = False) -> dict[str, Any]:
    """Forward (+ backward) into `out=` buffers allocated once, against the all-core copy.

    No page zero-fill of new results, so the bound is the copy bound without it. The op
    and the copy of x are timed in alternating rounds
    ([against_copy][normlab.bench.bandwidth.against_copy]): the forward moves one copy's
    bytes (reads x, writes out), the forward + backward 2.5 (and reads x and dout, writes
    dx).

    Parameters
    ----------
    name, shape, ctx
        As in [bench_norm][normlab.bench.norm_cases.bench_norm].
    forward_only : bool, optional
        Time the forward alone (the row "<name> fwd out="). Default False.

    Returns
    -------
    row : dict
        As in [bench_norm][normlab.bench.norm_cases.bench_norm].
    """
    case = _norm_case(name, shape, ctx["rng"])
    x, dy, g, b = case["x"], case["dy"], case["g"], case["b"]
    y, dx, dg, db = np.empty_like(x), np.empty_like(x), np.empty_like(g), np.empty_like(b)
    if name == "layer_norm":
        def fwd() -> Any:
            return nl.layer_norm_forward(x, g, b, out=y)

        def bwd(cache: Any) -> Any:
            return nl.layer_norm_backward(dy, cache, out=(dx, dg, db))
    else:
        def fwd() -> Any:
            return nl.rms_norm_forward(x, g, out=y)

        def bwd(cache: Any) -> Any:
            return nl.rms_norm_backward(dy, cache, out=(dx, dg))

    def fwd_bwd() -> Any:
        return bwd(fwd()[1])

    copies = 1.0 if forward_only else 2.5  # bytes moved / (2 x.nbytes)
    op = f"{name} fwd out=" if forward_only else f"{name} fwd+bwd out="
    row: dict[str, Any] = {"op": op, "shape": list(shape)}
    if ctx["kernels"]:
        fwd_bwd()
        out, cache = case["fwd"](x, g)
        same = np.array_equal(y, out) and np.array_equal(dx, case["bwd"](dy, cache)[0])
        row["check"] = {"same_as_new_arrays": bool(same)}
        row.update(against_copy(fwd if forward_only else fwd_bwd, x, copies, ctx["budget"]))
    else:
        row["bound_s"] = row["bound_alloc_s"] = 2 * copies * x.nbytes / ctx["bandwidth"]
    return row
