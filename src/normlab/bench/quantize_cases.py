"""The benchmark's quantize cases: bf16 and fp8 E4M3 (nearest), with and without `out=`.

Contract: as [normlab.bench.norm_cases][] (`bench_*(fmt, shape, ctx)` returns one row).
The kernel is checked bit for bit against the NumPy reference before timing; bytes that
must move: read x, write the result (2 arrays). Compared with the ml_dtypes round trip
`x.astype(dtype).astype(np.float32)`.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from normlab import _backend
from normlab.bench.timing import time_into
from normlab.precision import quantize

__all__ = ["bench_quantize", "bench_quantize_out"]


def bench_quantize_out(fmt: str, shape: tuple[int, int], ctx: dict[str, Any]
                        ) -> dict[str, Any]:
    """`quantize` into an `out=` buffer allocated once (2 passes over memory, nothing new).

    Takes and returns what [bench_quantize][normlab.bench.quantize_cases.bench_quantize]
    does; the row's `check` says whether the buffer holds the new array's bits.
    """
    x = ctx["rng"].standard_normal(shape, dtype=np.float32) * 4
    buf = np.empty_like(x)
    row: dict[str, Any] = {"op": f"quantize {fmt} nearest out=", "shape": list(shape)}
    if ctx["kernels"]:
        same = np.array_equal(quantize(x, fmt, out=buf).view(np.uint32),
                              quantize(x, fmt).view(np.uint32))
        row["check"] = {"same_as_new_array": bool(same)}
        time_into(row, "normlab", lambda: quantize(x, fmt, out=buf), ctx["budget"])
    row["bound_s"] = row["bound_alloc_s"] = 2 * x.nbytes / ctx["bandwidth"]
    return row


def bench_quantize(fmt: str, shape: tuple[int, int], ctx: dict[str, Any]) -> dict[str, Any]:
    """`quantize` returning a new array: kernel, NumPy reference and ml_dtypes.

    Kernel and ml_dtypes run on the whole array; the (slow) NumPy reference on a block of
    leading rows (about $2^{20}$ values, $2^{16}$ with `--quick`), checked bit for bit
    against the kernel on that block, its time scaled to the whole array (`numpy_rows`:
    the rows it ran on).

    Parameters
    ----------
    fmt : str
        "bf16" or "e4m3".
    shape, ctx
        As in [bench_norm][normlab.bench.norm_cases.bench_norm].

    Returns
    -------
    row : dict
        As in [bench_norm][normlab.bench.norm_cases.bench_norm].
    """
    x = ctx["rng"].standard_normal(shape, dtype=np.float32) * 4
    sub = x[: max(1, min(shape[0], ctx["ref_values"] // shape[1]))]  # (r, W) leading rows
    mld = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[fmt]
    row: dict[str, Any] = {"op": f"quantize {fmt} nearest", "shape": list(shape),
                           "numpy_rows": sub.shape[0]}
    with _backend.use_backend("numpy"):
        ref = quantize(sub, fmt)
        time_into(row, "numpy", lambda: quantize(sub, fmt), ctx["budget"], slow=True)
        for key in ("numpy_s", "numpy_min_s"):
            row[key] *= shape[0] / sub.shape[0]
    if ctx["kernels"]:
        same = np.array_equal(quantize(sub, fmt).view(np.uint32), ref.view(np.uint32))
        row["check"] = {"bit_identical": bool(same)}
        time_into(row, "normlab", lambda: quantize(x, fmt), ctx["budget"])
    time_into(row, "ml_dtypes", lambda: x.astype(mld).astype(np.float32), ctx["budget"])
    row["bound_s"] = 2 * x.nbytes / ctx["bandwidth"]
    row["bound_alloc_s"] = row["bound_s"] + x.nbytes * ctx["page_cost"]  # the result is new
    return row
