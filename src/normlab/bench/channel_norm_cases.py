r"""The benchmark's BatchNorm and GroupNorm cases: forward + backward, with and without `out=`.

Contract: as [normlab.bench.norm_cases][] (`bench_*(name, shape, ctx)` returns one row).
BatchNorm runs in training mode on (N, C) with running statistics tracked, GroupNorm on
(N, C, H, W) with `GROUPS` groups; both with gamma and beta. Bytes that must move: the
forward reads x and writes out, the backward reads x and dout and writes dx (5 arrays, the
bound of the row norms). Compared with `torch.nn.functional.batch_norm` / `group_norm`
plus autograd backward. Correctness against the float64 reference within
$16 \epsilon_{32} \sqrt{n} \max|ref|$, n the longest reduction (values per feature for
BatchNorm, per (sample, group) or per channel for GroupNorm); `out=` rows equal to the
new-array results, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

import normlab as nl
from normlab import _backend
from normlab.bench.memory import peak_extra
from normlab.bench.timing import time_into

__all__ = ["GROUPS", "bench_channel_norm", "bench_channel_norm_out"]

GROUPS = 32
"""GroupNorm's groups (as in Wu & He's experiments)."""
_EPS32 = float(np.finfo(np.float32).eps)


def _case(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, Any]:
    x = (rng.standard_normal(shape, dtype=np.float32) * 2 + 3).astype(np.float32)
    dy = rng.standard_normal(shape, dtype=np.float32)
    g = rng.standard_normal(shape[1], dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    return {"name": name, "x": x, "dy": dy, "g": g, "b": b,
            "rm": np.zeros(shape[1], np.float32), "rv": np.ones(shape[1], np.float32)}


def _fwd(case: dict[str, Any], x: np.ndarray, out: np.ndarray | None = None) -> Any:
    """The forward on x (any dtype) with the case's parameters cast to x's dtype."""
    g, b = (case[k].astype(x.dtype, copy=False) for k in ("g", "b"))
    if case["name"] == "batch_norm":  # the float32 runs track the case's running statistics
        rm, rv = (case[k].astype(x.dtype, copy=False) for k in ("rm", "rv"))
        return nl.batch_norm_forward(x, g, b, rm, rv, True, out=out)
    return nl.group_norm_forward(x, GROUPS, g, b, out=out)


def _bwd(case: dict[str, Any], dy: np.ndarray, cache: Any, out: Any = None) -> Any:
    if case["name"] == "batch_norm":
        return nl.batch_norm_backward(dy, cache, out=out)
    return nl.group_norm_backward(dy, cache, out=out)


def _longest_reduction(case: dict[str, Any]) -> int:
    x = case["x"]
    per_channel = x.size // x.shape[1]
    if case["name"] == "batch_norm":
        return per_channel
    return max(per_channel, x.size // (x.shape[0] * GROUPS))


def _check(case: dict[str, Any]) -> dict[str, float]:
    """Max error vs the float64 reference in units of 16 eps32 sqrt(n) max|ref|."""
    x, dy = case["x"], case["dy"]
    out, cache = _fwd(case, x)
    got = (out, *_bwd(case, dy, cache))
    with _backend.use_backend("numpy"):
        ro, rc = _fwd(case, x.astype(np.float64))
        ref = (ro, *_bwd(case, dy.astype(np.float64), rc))
    tol = 16 * _EPS32 * math.sqrt(_longest_reduction(case))
    names = ("out", "dx", "dgamma", "dbeta")
    return {n: float(np.max(np.abs(a - r)) / (tol * np.max(np.abs(r))))
            for n, a, r in zip(names, got, ref, strict=True)}


def _torch_run(torch: Any, case: dict[str, Any]) -> Callable[[], None]:
    tx = torch.from_numpy(case["x"]).requires_grad_()
    tg = torch.from_numpy(case["g"]).requires_grad_()
    tb = torch.from_numpy(case["b"]).requires_grad_()
    tdy = torch.from_numpy(case["dy"])
    trm, trv = torch.from_numpy(case["rm"].copy()), torch.from_numpy(case["rv"].copy())
    functional = torch.nn.functional

    def run() -> None:
        if case["name"] == "batch_norm":  # PyTorch's momentum 0.1 = normlab's 0.9
            y = functional.batch_norm(tx, trm, trv, tg, tb, True, 0.1, 1e-5)
        else:
            y = functional.group_norm(tx, GROUPS, tg, tb, 1e-5)
        y.backward(tdy)
        tx.grad = tg.grad = tb.grad = None

    return run


def bench_channel_norm(name: str, shape: tuple[int, ...], ctx: dict[str, Any]
                       ) -> dict[str, Any]:
    """BatchNorm or GroupNorm forward + backward returning new arrays.

    Parameters
    ----------
    name : str
        "batch_norm" or "group_norm".
    shape : tuple of int
        (N, C) for BatchNorm, (N, C, H, W) for GroupNorm; float32.
    ctx : dict
        The run's context (see [normlab.bench.norm_cases][]).

    Returns
    -------
    row : dict
        One row of the table.
    """
    case = _case(name, shape, ctx["rng"])
    x, dy = case["x"], case["dy"]

    def fwd_bwd() -> Any:
        out, cache = _fwd(case, x)
        return out, _bwd(case, dy, cache)

    row: dict[str, Any] = {"op": f"{name} fwd+bwd", "shape": list(shape)}
    if ctx["kernels"]:
        row["check"] = _check(case)
        time_into(row, "normlab", fwd_bwd, ctx["budget"])
        row["normlab_peak_extra_bytes"] = peak_extra(fwd_bwd)
    with _backend.use_backend("numpy"):
        time_into(row, "numpy", fwd_bwd, ctx["budget"], slow=True)
        row["numpy_peak_extra_bytes"] = peak_extra(fwd_bwd)
    row["outputs_bytes"] = 2 * x.nbytes  # out and dx
    if ctx["torch"] is not None:
        time_into(row, "torch", _torch_run(ctx["torch"], case), ctx["budget"])
    row["bound_s"] = 5 * x.nbytes / ctx["bandwidth"]
    row["bound_alloc_s"] = row["bound_s"] + 2 * x.nbytes * ctx["page_cost"]  # new out, dx
    return row


def bench_channel_norm_out(name: str, shape: tuple[int, ...], ctx: dict[str, Any]
                           ) -> dict[str, Any]:
    """The same into `out=` buffers allocated once: held to the plain bound.

    Takes and returns what
    [bench_channel_norm][normlab.bench.channel_norm_cases.bench_channel_norm] does; the
    row's `check` says whether the buffers hold the new arrays' values.
    """
    case = _case(name, shape, ctx["rng"])
    x, dy = case["x"], case["dy"]
    y, dx = np.empty_like(x), np.empty_like(x)
    grads = (dx, np.empty_like(case["g"]), np.empty_like(case["b"]))

    def fwd_bwd() -> Any:
        _, cache = _fwd(case, x, y)
        return _bwd(case, dy, cache, grads)

    row: dict[str, Any] = {"op": f"{name} fwd+bwd out=", "shape": list(shape)}
    if ctx["kernels"]:
        fwd_bwd()
        out, cache = _fwd(case, x)
        new = (out, *_bwd(case, dy, cache))
        same = all(np.array_equal(a, b) for a, b in zip((y, *grads), new, strict=True))
        row["check"] = {"same_as_new_arrays": bool(same)}
        time_into(row, "normlab", fwd_bwd, ctx["budget"])
    row["bound_s"] = row["bound_alloc_s"] = 5 * x.nbytes / ctx["bandwidth"]
    return row
