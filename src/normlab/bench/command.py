"""`normlab bench`: the command line of the benchmark, and the order of its sections.

Sections (`--only` picks some; all run by default):

- `kernels`: the fused kernels against the NumPy references, PyTorch and ml_dtypes, and
  the copy-bandwidth bound (the table of [normlab.bench.table][]), then the kernels'
  compile times (`--no-compile` skips them);
- `torch-quantize`: `normlab.torch.quantize` against its yardsticks
  ([normlab.bench.torch_quantize][]);
- `training`: emulated low-precision training, step time and saved-for-backward bytes per
  recipe, torchao beside it ([normlab.bench.training][]);
- `inspect`: the numerics inspector's step against the plain step, `every=1` and
  `every=10` ([normlab.bench.inspect_overhead][]).
- `cold-start`: the first forward and backward of a converted model per recipe in a new
  process with an empty kernel cache (the background compile helper on, then off), then a
  warm one
  ([torch_cold_start][normlab.bench.compile_time.torch_cold_start]; `--no-compile`
  skips it).

The torch sections run when PyTorch is installed and say so when it is not; this module
imports PyTorch only then.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from normlab import _backend
from normlab.bench.bandwidth import copy_bandwidth, kernel_threads
from normlab.bench.channel_norm_cases import bench_channel_norm, bench_channel_norm_out
from normlab.bench.compile_time import compile_times, format_cold_start, torch_cold_start
from normlab.bench.norm_cases import SMALL_SHAPES, bench_norm, bench_norm_out
from normlab.bench.quantize_cases import bench_quantize, bench_quantize_out
from normlab.bench.table import report
from normlab.bench.timing import other_load

__all__ = ["SECTIONS", "main"]

SECTIONS = ("kernels", "torch-quantize", "training", "inspect", "cold-start")
"""The sections of the benchmark, in the order they run."""
_NO_TORCH = 'skipped: PyTorch is not installed (pip install ".[torch]")'


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def _sections(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in chosen if s not in SECTIONS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(
            f"sections must be a comma-separated list of {', '.join(SECTIONS)}; got {text!r}")
    return chosen


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="normlab bench",
        description="Benchmark of the fused kernels against the NumPy references, PyTorch "
                    "and ml_dtypes, and of emulated low-precision training.")
    p.add_argument("--quick", action="store_true",
                   help="small shapes and a short time budget (a smoke run of every code path)")
    p.add_argument("--json", metavar="PATH", help="also write the raw results as JSON to PATH")
    p.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per timed op before giving up on a stable median (default 3)")
    p.add_argument("--repeats", type=int, default=None,
                   help="ignored (kept for old scripts: timing now repeats until stable)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the compile-time measurement in child processes")
    p.add_argument("--only", type=_sections, default=SECTIONS, metavar="SECTION,...",
                   help=f"run only these sections ({', '.join(SECTIONS)}; default all)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating rounds per step-time ratio of the training section "
                        "(default 5, 2 with --quick)")
    return p


def _shapes(quick: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(small shapes: norms only, per-call overhead; large shapes: every op)."""
    large = [(256, 1024), (4096, 64)] if quick else [(8192, 4096), (65536, 1024)]
    return list(SMALL_SHAPES), large


def _kernel_section(args: argparse.Namespace, budget: float, torch: Any) -> dict[str, Any]:
    """The kernel table: rows, machine facts and the verdict; printed before returning."""
    small, large = _shapes(args.quick)
    kernels = _backend.kernel("layer_norm_forward") is not None
    load = other_load()
    ctx: dict[str, Any] = {"rng": np.random.default_rng(0), "budget": budget,
                           "kernels": kernels, "torch": torch,
                           "ref_values": 2**16 if args.quick else 2**20}
    # at least 64 MiB per buffer, so the copy streams from memory, not from the caches
    ctx["bandwidth"], fresh_bw = copy_bandwidth(max(4 * large[0][0] * large[0][1], 2**26),
                                                budget)
    # seconds per byte of a freshly allocated output beyond the copy itself (page zero-fill)
    ctx["page_cost"] = max(0.0, 2 / fresh_bw - 2 / ctx["bandwidth"])
    info = {
        "cpu_count": os.cpu_count(), "load_average_1min": None if load is None else load[0],
        "numba_threads": kernel_threads(),
        "torch_threads": torch.get_num_threads() if torch else None,
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
        rows += [bench_norm_out(name, shape, ctx, forward_only=fo)
                 for name in ("layer_norm", "rms_norm") for fo in (True, False)]
        rows += [bench_quantize_out(fmt, shape, ctx) for fmt in ("bf16", "e4m3")]
    channel = {"batch_norm": large[-1],
               "group_norm": (8, 64, 16, 16) if args.quick else (64, 256, 32, 32)}
    rows += [bench(name, shape, ctx) for name, shape in channel.items()
             for bench in (bench_channel_norm, bench_channel_norm_out)]
    ok = all((v <= 1.0 if isinstance(v, float) else v)
             for r in rows for v in r.get("check", {}).values())
    if kernels and not args.no_compile:
        info["compile"] = compile_times()
    load_end = other_load()
    info["load_average_1min_end"] = None if load_end is None else load_end[0]
    loads = [v for v in (load, load_end) if v is not None]
    report(info, rows, ok, args.markdown, max(loads) if loads else None)
    return {"info": info, "rows": rows, "correct": ok}


def _torch_quantize_section(quick: bool, large: tuple[int, int]) -> list[dict[str, Any]]:
    from normlab.bench.torch_quantize import format_rows, quantize_rows

    rows = quantize_rows(large, ("bf16", "e4m3"), repeats=3 if quick else 5)
    print("normlab.torch.quantize (CPU target: within 3x of numba; CUDA: within 2x of "
          "an fp8 round trip)")
    print(format_rows(rows))
    return rows


def _torch_section(args: argparse.Namespace, key: str, module: str) -> dict[str, Any]:
    """Run `<key>_section` of `normlab.bench.<module>` (imported here: it needs torch) and
    print it through the module's `format_<key>`."""
    mod = importlib.import_module(f"normlab.bench.{module}")
    section: dict[str, Any] = getattr(mod, f"{key}_section")(quick=args.quick,
                                                             rounds=args.rounds)
    print(getattr(mod, f"format_{key}")(section, args.markdown))
    return section


_TORCH_SECTIONS = (  # (--only name = result key, what a skip names, module)
    ("training", "emulated training", "training"),
    ("inspect", "numerics inspector", "inspect_overhead"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark: in each section, correctness checks first, then the timings.

    Kernel times are medians of samples taken until the median is stable
    ([measure][normlab.bench.timing.measure]), with the minimum and the interquartile
    spread beside them; a warning is printed when a spread exceeds 10% or other processes
    load the cores. Comparisons of two calls are timed in alternating rounds
    ([alternate][normlab.bench.timing.alternate]).

    Parameters
    ----------
    argv : sequence of str or None, optional
        Command-line arguments (`--quick`, `--json PATH`, `--markdown`, `--budget S`,
        `--no-compile`, `--only SECTION,...`, `--rounds N`); None reads `sys.argv`.

    Returns
    -------
    status : int
        0 when every check passed (or no kernel was there to check), 1 otherwise.

    Examples
    --------
    >>> main(["--quick", "--no-compile", "--json", "bench.json"])  # doctest: +SKIP
    0
    """
    args = _parser().parse_args(argv)
    budget = args.budget or (0.3 if args.quick else 3.0)
    torch = _torch()
    result: dict[str, Any] = {}
    ok = True
    if "kernels" in args.only:
        kernel = _kernel_section(args, budget, torch)
        result.update(kernel)
        ok = ok and kernel["correct"]
    if "torch-quantize" in args.only:
        result["torch_rows"] = []
        if torch is None:
            print("normlab.torch.quantize:", _NO_TORCH)
        else:
            result["torch_rows"] = _torch_quantize_section(args.quick, _shapes(args.quick)[1][0])
            ok = ok and all(r["bit_identical"] for r in result["torch_rows"])
    for key, what, module in _TORCH_SECTIONS:
        if key not in args.only:
            continue
        if torch is None:
            print(f"{what}:", _NO_TORCH)
        else:
            result[key] = _torch_section(args, key, module)
            ok = ok and result[key]["ok"]
    if "cold-start" in args.only and not args.no_compile:
        if torch is None:
            print("cold start of normlab.torch:", _NO_TORCH)
        else:
            result["cold_start"] = torch_cold_start()
            print(format_cold_start(result["cold_start"]))
            ok = ok and all(t["same_result"] for t in result["cold_start"].values())
    result["correct"] = ok
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
