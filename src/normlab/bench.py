"""Benchmark of the fused kernels against the NumPy references, PyTorch and ml_dtypes.

Run ``python -m normlab.bench`` (or ``normlab bench``); ``--quick`` for a smoke run,
``--json PATH`` to save the numbers. It first checks correctness on the benchmark arrays
(norms within float32 rounding of a float64 reference, quantize bit-identical to the NumPy
reference), then times each op (median of several repeats after one warm-up call) and
relates it to the memory-bandwidth bound: bytes that must move divided by the copy
bandwidth measured in the same run (``nl/bound``), and to that bound plus the OS's zero-fill
of the pages of the new output arrays every caller receives (``nl/b+new``, measured as
``src.copy()`` minus a copy into an existing array). Ops and the bytes they must move
(float32, R x W):

* LayerNorm / RMSNorm forward+backward: forward reads x and writes out, backward reads x
  and dout and writes dx: 5 arrays. Compared with ``torch.nn.functional.layer_norm`` /
  ``rms_norm`` plus autograd backward when PyTorch is installed (imported lazily here: the
  library itself never imports it).
* quantize to bf16 and fp8 E4M3 (nearest): read x, write the result: 2 arrays. Compared
  with the ml_dtypes round trip ``x.astype(dtype).astype(np.float32)``.

Also reported: peak extra memory of a norm forward+backward (tracemalloc) and first-call
compile time of the kernels, measured in child processes with an empty and then a warm
on-disk cache (the second shows that a new process does not recompile).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

import normlab as nl
from normlab import _backend
from normlab.precision import quantize

__all__ = ["main"]

_EPS32 = float(np.finfo(np.float32).eps)


def _timeit(fn: Callable[[], Any], repeats: int, budget_s: float) -> float:
    """Median seconds of ``fn`` over up to ``repeats`` calls after one warm-up call."""
    fn()  # warm-up: compilation / cache load, first-touch of buffers
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_bandwidth(nbytes: int, repeats: int) -> tuple[float, float]:
    """Bytes per second of a large copy (read + write) into an existing buffer, best of NumPy
    and a numba prange (the bound's yardstick), and of ``src.copy()`` into a new array (the
    cost every op returning a fresh array also pays: the OS zero-fills new pages)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = _timeit(lambda: np.copyto(dst, src), repeats, 2.0)
    if _backend.kernel("layer_norm_forward") is not None:
        from normlab.kernels import _copy

        best = min(best, _timeit(lambda: _copy.parallel_copy(src, dst), repeats, 2.0))
    fresh = _timeit(src.copy, repeats, 2.0)
    return 2 * src.nbytes / best, 2 * src.nbytes / fresh


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _torch_quantize_rows(shape: tuple[int, int], repeats: int) -> list[dict[str, Any]]:
    """normlab.torch.quantize rows (normlab.torch.bench), when the torch extra is there."""
    try:
        from normlab.torch.bench import quantize_rows
    except ImportError:
        return []
    return quantize_rows(shape, ("bf16", "e4m3"), repeats=repeats)


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


def _bench_norm(name: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    case = _norm_case(name, shape, ctx["rng"])
    x, dy, g = case["x"], case["dy"], case["g"]

    def fwd_bwd() -> Any:
        out, cache = case["fwd"](x, g)
        return out, case["bwd"](dy, cache)

    row: dict[str, Any] = {"op": f"{name} fwd+bwd", "shape": list(shape)}
    if ctx["kernels"]:
        row["check"] = _check_norm(case)
        row["normlab_s"] = _timeit(fwd_bwd, ctx["repeats"], ctx["budget"])
        row["normlab_peak_extra_bytes"] = _peak_extra(fwd_bwd)
    with _backend.use_backend("numpy"):
        row["numpy_s"] = _timeit(fwd_bwd, ctx["slow_repeats"], ctx["budget"])
        row["numpy_peak_extra_bytes"] = _peak_extra(fwd_bwd)
    row["outputs_bytes"] = 2 * x.nbytes  # out and dx: what the caller keeps
    if ctx["torch"] is not None:
        row["torch_s"] = _timeit(_torch_norm(ctx["torch"], name, case), ctx["repeats"],
                                 ctx["budget"])
    row["bound_s"] = 5 * x.nbytes / ctx["bandwidth"]
    row["bound_alloc_s"] = row["bound_s"] + 2 * x.nbytes * ctx["page_cost"]  # out, dx are new
    return row


def _bench_quantize(fmt: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    """Kernel and ml_dtypes on the whole array; the (slow, memory-hungry) NumPy reference on
    a block of leading rows (about 2^20 values), checked bit for bit against the kernel on
    that block and its time scaled to the whole array (``numpy_rows`` says how many rows)."""
    x = ctx["rng"].standard_normal(shape, dtype=np.float32) * 4
    sub = x[: max(1, min(shape[0], 2**20 // shape[1]))]  # (r, W) leading rows
    mld = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[fmt]
    row: dict[str, Any] = {"op": f"quantize {fmt} nearest", "shape": list(shape),
                           "numpy_rows": sub.shape[0]}
    with _backend.use_backend("numpy"):
        ref = quantize(sub, fmt)
        t_sub = _timeit(lambda: quantize(sub, fmt), ctx["slow_repeats"], ctx["budget"])
        row["numpy_s"] = t_sub * shape[0] / sub.shape[0]
    if ctx["kernels"]:
        same = np.array_equal(quantize(sub, fmt).view(np.uint32), ref.view(np.uint32))
        row["check"] = {"bit_identical": bool(same)}
        row["normlab_s"] = _timeit(lambda: quantize(x, fmt), ctx["repeats"], ctx["budget"])
    row["ml_dtypes_s"] = _timeit(lambda: x.astype(mld).astype(np.float32), ctx["repeats"],
                                 ctx["budget"])
    row["bound_s"] = 2 * x.nbytes / ctx["bandwidth"]
    row["bound_alloc_s"] = row["bound_s"] + x.nbytes * ctx["page_cost"]  # the result is new
    return row


_COMPILE_SNIPPET = """
import time, numpy as np
t0 = time.perf_counter()
import normlab as nl
from normlab.precision import quantize
x = np.ones((4, 8), np.float32)
o, c = nl.layer_norm_forward(x, x[0], x[0]); nl.layer_norm_backward(x, c)
o, c = nl.rms_norm_forward(x, x[0]); nl.rms_norm_backward(x, c)
quantize(x, "bf16")
print(time.perf_counter() - t0)
"""


def _compile_times() -> dict[str, float]:
    """Import + first calls (LN, RMS fwd/bwd, quantize) in fresh processes: cold, then warm."""
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for label in ("cold_cache_s", "warm_cache_s"):
            proc = subprocess.run([sys.executable, "-c", _COMPILE_SNIPPET], env=env,
                                  capture_output=True, text=True, check=True)
            result[label] = float(proc.stdout.strip().splitlines()[-1])
    return result


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:9.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:6.2f}x"


def _table(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'op':26} {'shape':>12} {'numpy ms':>9} {'normlab':>9} {'torch':>9} "
            f"{'ml_dtypes':>9} {'bound':>9} {'nl/bound':>8} {'nl/b+new':>8} {'vs torch':>8} "
            f"{'vs mld':>8} {'vs numpy':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        nls = r.get("normlab_s")
        lines.append(
            f"{r['op']:26} {'x'.join(map(str, r['shape'])):>12} {_fmt_ms(r.get('numpy_s'))} "
            f"{_fmt_ms(nls)} {_fmt_ms(r.get('torch_s'))} {_fmt_ms(r.get('ml_dtypes_s'))} "
            f"{_fmt_ms(r['bound_s'])} {_ratio(nls, r['bound_s']):>8} "
            f"{_ratio(nls, r['bound_alloc_s']):>8} "
            f"{_ratio(r.get('torch_s'), nls):>8} {_ratio(r.get('ml_dtypes_s'), nls):>8} "
            f"{_ratio(r.get('numpy_s'), nls):>8}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normlab bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small shapes and few repeats (a smoke run of every code path)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per op (default 7)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the compile-time measurement in child processes")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark: correctness checks first, then the timing table.

    Parameters
    ----------
    argv : command-line arguments (``--quick``, ``--json PATH``, ``--repeats N``,
        ``--no-compile``); None reads ``sys.argv``.

    Returns
    -------
    0 when every check passed (or no kernel was there to check), 1 otherwise.

    Example
    -------
    >>> main(["--quick", "--no-compile", "--json", "bench.json"])  # doctest: +SKIP
    0
    """
    args = _parser().parse_args(argv)
    shapes = [(256, 1024), (4096, 64)] if args.quick else [(8192, 4096), (65536, 1024)]
    repeats = args.repeats or (3 if args.quick else 7)
    kernels = _backend.kernel("layer_norm_forward") is not None
    ctx: dict[str, Any] = {
        "rng": np.random.default_rng(0), "repeats": repeats, "slow_repeats": min(repeats, 3),
        "budget": 1.0 if args.quick else 3.0, "kernels": kernels, "torch": _torch(),
    }
    # at least 64 MiB per buffer, so the copy streams from memory, not from the caches
    ctx["bandwidth"], fresh_bw = _copy_bandwidth(max(4 * shapes[0][0] * shapes[0][1], 2**26),
                                                 repeats)
    # seconds per byte of a freshly allocated output beyond the copy itself (page zero-fill)
    ctx["page_cost"] = max(0.0, 2 / fresh_bw - 2 / ctx["bandwidth"])
    threads = None
    if kernels:
        from normlab.kernels import _copy

        threads = _copy.num_threads()
    info = {
        "cpu_count": os.cpu_count(), "numba_threads": threads,
        "torch_threads": ctx["torch"].get_num_threads() if ctx["torch"] else None,
        "kernels": kernels, "copy_bandwidth_GBps": ctx["bandwidth"] / 1e9,
        "copy_to_new_array_GBps": fresh_bw / 1e9,
    }
    if not kernels:
        print("kernels unavailable (NORMLAB_BACKEND=numpy or numba missing): reference only")
    rows = []
    for shape in shapes:
        for name in ("layer_norm", "rms_norm"):
            rows.append(_bench_norm(name, shape, ctx))
        for fmt in ("bf16", "e4m3"):
            rows.append(_bench_quantize(fmt, shape, ctx))
    ok = all(
        (v <= 1.0 if isinstance(v, float) else v)
        for r in rows for v in r.get("check", {}).values()
    )
    torch_rows = _torch_quantize_rows(shapes[0], repeats) if ctx["torch"] else []
    ok = ok and all(r["bit_identical"] for r in torch_rows)
    if kernels and not args.no_compile:
        info["compile"] = _compile_times()
    print(json.dumps(info, indent=None))
    print(_table(rows))
    verdict = ("ok" if ok else "FAILED") if kernels else "not checked (no kernels)"
    print("correctness:", verdict, "(norm errors in units of 16 eps32 sqrt(W) "
          "max|ref|; quantize bit-identical to the reference on the rows it was timed on; its "
          "NumPy time is scaled from those rows to the whole array)")
    for r in rows:
        if "normlab_peak_extra_bytes" in r:
            print(f"peak extra memory {r['op']} {r['shape']}: normlab "
                  f"{r['normlab_peak_extra_bytes'] / r['outputs_bytes']:.3f} x (out + dx), "
                  f"numpy {r['numpy_peak_extra_bytes'] / r['outputs_bytes']:.2f} x")
    if torch_rows:
        from normlab.torch.bench import format_rows

        print("normlab.torch.quantize (CPU target: within 3x of numba; CUDA: within 2x of "
              "an fp8 round trip)")
        print(format_rows(torch_rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"info": info, "rows": rows, "torch_rows": torch_rows, "correct": ok},
                      fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
