"""Benchmark of the fused kernels against the NumPy references, PyTorch and ml_dtypes.

Run ``python -m normlab.bench`` (or ``normlab bench``); ``--quick`` for a smoke run,
``--markdown`` for a markdown table, ``--json PATH`` to also save the raw numbers. It first
checks correctness on the benchmark arrays (norms within float32 rounding of a float64
reference, quantize bit-identical to the NumPy reference), then times each op with
:func:`normlab._timing.measure` (samples until the median is stable; median, minimum and
interquartile spread reported, a warning when a spread exceeds 10% or the load average shows
other processes on the cores), and relates it to the memory-bandwidth bound: bytes that must
move divided by the copy bandwidth measured in the same run ("normlab / bound"), and to that
bound plus the OS's zero-fill of the pages of the new output arrays every caller receives
("normlab / bound+new", measured as ``src.copy()`` minus a copy into an existing array).
Ops and the bytes they must move (float32, R x W):

* LayerNorm / RMSNorm forward+backward: forward reads x and writes out, backward reads x
  and dout and writes dx: 5 arrays. Compared with ``torch.nn.functional.layer_norm`` /
  ``rms_norm`` plus autograd backward when PyTorch is installed (imported lazily here: the
  library itself never imports it). Also at the small shapes (8, 64) and (64, 512), where
  the time per call is overhead (validation, dispatch, allocation), not bandwidth: no bound.
* quantize to bf16 and fp8 E4M3 (nearest): read x, write the result: 2 arrays. Compared
  with the ml_dtypes round trip ``x.astype(dtype).astype(np.float32)``.
* BatchNorm forward+backward (training, running statistics tracked) at the last large
  shape and GroupNorm forward+backward (32 groups) at (64, 256, 32, 32), (8, 64, 16, 16)
  with ``--quick``: the same 5 arrays, beside ``torch.nn.functional.batch_norm`` /
  ``group_norm`` plus autograd backward. BatchNorm's statistics span the whole batch, so
  a large x is read twice in each direction: 8 passes over memory, not 5.
* the same norms and quantize with ``out=`` buffers allocated once ("out=" rows): no page
  zero-fill of new results, so their bound is the plain copy bound.

Also reported: peak extra memory of a norm forward+backward (tracemalloc) and first-call
compile time of the kernels, measured in child processes with an empty and then a warm
on-disk cache (the second shows that a new process does not recompile).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from normlab import _backend
from normlab._bench_cases import (
    SMALL_SHAPES,
    bench_norm,
    bench_norm_out,
    bench_quantize,
    bench_quantize_out,
)
from normlab._bench_channel_norms import bench_channel_norm, bench_channel_norm_out
from normlab._bench_table import report
from normlab._timing import measure, other_load

__all__ = ["SMALL_SHAPES", "main"]



def _copy_bandwidth(nbytes: int, budget: float) -> tuple[float, float]:
    """Bytes per second of a large copy (read + write) into an existing buffer, best of NumPy
    and a numba prange (the bound's yardstick), and of ``src.copy()`` into a new array (the
    cost every op returning a fresh array also pays: the OS zero-fills new pages)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = measure(lambda: np.copyto(dst, src), budget_s=budget).median_s
    if _backend.kernel("layer_norm_forward") is not None:
        from normlab import kernels

        best = min(best, measure(lambda: kernels.parallel_copy(src, dst),
                                 budget_s=budget).median_s)
    fresh = measure(src.copy, budget_s=budget).median_s
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


_COMPILE_SNIPPET = """
import time, numpy as np
t0 = time.perf_counter()
import normlab as nl
from normlab.precision import quantize
x = np.ones((4, 8), np.float32)
o, c = nl.layer_norm_forward(x, x[0], x[0]); nl.layer_norm_backward(x, c)
o, c = nl.rms_norm_forward(x, x[0]); nl.rms_norm_backward(x, c)
o, c = nl.batch_norm_forward(x, x[0], x[0], None, None, True); nl.batch_norm_backward(x, c)
g = np.ones((2, 4, 3), np.float32)
o, c = nl.group_norm_forward(g, 2, g[0, :, 0], g[0, :, 0]); nl.group_norm_backward(g, c)
quantize(x, "bf16")
print(time.perf_counter() - t0)
"""


def _compile_times() -> dict[str, float]:
    """Import + first calls (LN, RMS, BN, GN fwd/bwd, quantize) in fresh processes: cold,
    then warm."""
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for label in ("cold_cache_s", "warm_cache_s"):
            proc = subprocess.run([sys.executable, "-c", _COMPILE_SNIPPET], env=env,
                                  capture_output=True, text=True, check=True)
            result[label] = float(proc.stdout.strip().splitlines()[-1])
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normlab bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small shapes and a short time budget (a smoke run of every code path)")
    p.add_argument("--json", metavar="PATH", help="also write the raw results as JSON to PATH")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per timed op before giving up on a stable median (default 3)")
    p.add_argument("--repeats", type=int, default=None,
                   help="ignored (kept for old scripts: timing now repeats until stable)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the compile-time measurement in child processes")
    return p


def _channel_rows(quick: bool, large: list[tuple[int, int]], ctx: dict[str, Any]
                  ) -> list[dict[str, Any]]:
    """BatchNorm at the last large shape and GroupNorm at an (N, C, H, W) shape, with and
    without ``out=``."""
    shapes: dict[str, tuple[int, ...]] = {
        "batch_norm": large[-1], "group_norm": (8, 64, 16, 16) if quick else (64, 256, 32, 32)}
    return [bench(name, shape, ctx) for name, shape in shapes.items()
            for bench in (bench_channel_norm, bench_channel_norm_out)]


def _shapes(quick: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(small shapes: norms only, per-call overhead; large shapes: every op)."""
    large = [(256, 1024), (4096, 64)] if quick else [(8192, 4096), (65536, 1024)]
    return list(SMALL_SHAPES), large


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark: correctness checks first, then the timing table.

    Times are medians of samples taken until the median is stable (``normlab._timing``),
    with the minimum and the interquartile spread beside them; a warning is printed when a
    spread exceeds 10% or other processes load the cores.

    Parameters
    ----------
    argv : command-line arguments (``--quick``, ``--json PATH``, ``--markdown``,
        ``--budget S``, ``--no-compile``); None reads ``sys.argv``.

    Returns
    -------
    0 when every check passed (or no kernel was there to check), 1 otherwise.

    Example
    -------
    >>> main(["--quick", "--no-compile", "--json", "bench.json"])  # doctest: +SKIP
    0
    """
    args = _parser().parse_args(argv)
    small, large = _shapes(args.quick)
    kernels = _backend.kernel("layer_norm_forward") is not None
    budget = args.budget or (0.3 if args.quick else 3.0)
    load = other_load()
    ctx: dict[str, Any] = {"rng": np.random.default_rng(0), "budget": budget,
                           "kernels": kernels, "torch": _torch(),
                           "ref_values": 2**16 if args.quick else 2**20}
    # at least 64 MiB per buffer, so the copy streams from memory, not from the caches
    ctx["bandwidth"], fresh_bw = _copy_bandwidth(max(4 * large[0][0] * large[0][1], 2**26),
                                                 budget)
    # seconds per byte of a freshly allocated output beyond the copy itself (page zero-fill)
    ctx["page_cost"] = max(0.0, 2 / fresh_bw - 2 / ctx["bandwidth"])
    info = {
        "cpu_count": os.cpu_count(), "load_average_1min": None if load is None else load[0],
        "numba_threads": _kernel_threads() if kernels else None,
        "torch_threads": ctx["torch"].get_num_threads() if ctx["torch"] else None,
        "kernels": kernels, "copy_bandwidth_GBps": ctx["bandwidth"] / 1e9,
        "copy_to_new_array_GBps": fresh_bw / 1e9,
    }
    if not kernels:
        print("kernels unavailable (NORMLAB_BACKEND=numpy or numba missing): reference only")
    rows = [bench_norm(name, shape, ctx) for shape in small
            for name in ("layer_norm", "rms_norm")]
    for shape in large:
        rows += [bench_norm(name, shape, ctx) for name in ("layer_norm", "rms_norm")]
        rows += [bench_quantize(fmt, shape, ctx) for fmt in ("bf16", "e4m3")]
        rows += [bench_norm_out(name, shape, ctx) for name in ("layer_norm", "rms_norm")]
        rows += [bench_quantize_out(fmt, shape, ctx) for fmt in ("bf16", "e4m3")]
    rows += _channel_rows(args.quick, large, ctx)
    ok = all(
        (v <= 1.0 if isinstance(v, float) else v)
        for r in rows for v in r.get("check", {}).values()
    )
    torch_rows = (_torch_quantize_rows(large[0], 3 if args.quick else 5) if ctx["torch"]
                  else [])
    ok = ok and all(r["bit_identical"] for r in torch_rows)
    if kernels and not args.no_compile:
        info["compile"] = _compile_times()
    load_end = other_load()
    info["load_average_1min_end"] = None if load_end is None else load_end[0]
    loads = [v for v in (load, load_end) if v is not None]
    report(info, rows, ok, args.markdown, max(loads) if loads else None)
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


def _kernel_threads() -> int:
    from normlab import kernels

    return kernels.num_threads()


if __name__ == "__main__":
    sys.exit(main())
