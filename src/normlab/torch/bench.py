"""Speed rows for ``normlab bench``: normlab.torch.quantize against its yardsticks.

Contract: every row first checks correctness (the timed result bit for bit against the
NumPy/numba ``normlab.precision.quantize`` on the same data, and GPU against CPU), then
times the median of ``repeats`` calls after a warm-up. Yardsticks (issue targets):
CPU float32 -> ``normlab.precision.quantize`` (numba kernel; target within 3x); CUDA ->
a plain ``t.to(torch.float8_e4m3fn).float()`` round trip (target within 2x).

Note: torch's CPU allocator does not ask for transparent huge pages unless
``THP_MEM_ALLOC_ENABLE=1`` is set before torch starts, while NumPy does for large arrays;
on Linux a fresh 128 MiB result then costs torch far more page faults than NumPy. Run
with the variable set to compare the arithmetic rather than the page faults.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from normlab.precision import quantize as np_quantize
from normlab.torch._import import torch
from normlab.torch.quantize import quantize

__all__ = ["format_rows", "quantize_rows"]


def _median_s(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up: kernels, allocator, first touch
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def quantize_rows(
    shape: Sequence[int] = (8192, 4096),
    fmts: Sequence[str] = ("bf16", "e4m3"),
    *,
    repeats: int = 5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time ``normlab.torch.quantize`` (nearest) on float32 ``shape`` against its yardsticks.

    Parameters
    ----------
    shape : the tensor shape, (R, C); default (8192, 4096) as in the issue
    fmts : format names, each one CPU row (and one CUDA row when a GPU is present)
    repeats : timed calls per measurement (median reported)
    seed : seed of the standard-normal data (times 4, as the NumPy rows of the bench)

    Returns
    -------
    list of dict: ``op``, ``shape``, ``device``, ``torch_s`` (normlab.torch.quantize),
    ``yardstick`` (what it is compared with), ``yardstick_s``, ``ratio`` and
    ``bit_identical`` (against the NumPy side, and for CUDA also against the CPU result).

    Example
    -------
    >>> rows = quantize_rows((64, 64), ("bf16",), repeats=1)
    >>> rows[0]["bit_identical"]
    True
    """
    x = np.random.default_rng(seed).standard_normal(tuple(shape), dtype=np.float32) * 4
    t = torch.from_numpy(x)
    rows = []
    for fmt in fmts:
        want = np_quantize(x, fmt).view(np.uint32)
        cpu = quantize(t, fmt)
        same = bool(np.array_equal(cpu.numpy().view(np.uint32), want))
        t_torch = _median_s(_bind(quantize, t, fmt), repeats, lambda: None)
        t_ref = _median_s(_bind(np_quantize, x, fmt), repeats, lambda: None)
        rows.append({"op": f"torch quantize {fmt} nearest", "shape": list(shape),
                     "device": "cpu", "torch_s": t_torch,
                     "yardstick": "normlab.precision.quantize (numba)",
                     "yardstick_s": t_ref, "ratio": t_torch / t_ref, "bit_identical": same})
        if torch.cuda.is_available():
            rows.append(_cuda_row(t, fmt, cpu, repeats))
    return rows


def _cuda_row(t: torch.Tensor, fmt: str, cpu: torch.Tensor, repeats: int) -> dict[str, Any]:
    g = t.cuda()
    same = torch.equal(quantize(g, fmt).cpu().view(torch.int32), cpu.view(torch.int32))
    sync = torch.cuda.synchronize
    t_torch = _median_s(lambda: quantize(g, fmt), repeats, sync)
    t_ref = _median_s(lambda: g.to(torch.float8_e4m3fn).float(), repeats, sync)
    return {"op": f"torch quantize {fmt} nearest", "shape": list(t.shape), "device": "cuda",
            "torch_s": t_torch, "yardstick": "t.to(float8_e4m3fn).float()",
            "yardstick_s": t_ref, "ratio": t_torch / t_ref, "bit_identical": bool(same)}


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a plain-text table (milliseconds).

    Example
    -------
    >>> print(format_rows([]).splitlines()[0])  # doctest: +ELLIPSIS
    op ...
    """
    head = (f"{'op':30} {'shape':>10} {'device':>6} {'torch ms':>9} {'yard ms':>9} "
            f"{'ratio':>6} {'exact':>5}  yardstick")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['op']:30} {'x'.join(map(str, r['shape'])):>10} {r['device']:>6} "
            f"{r['torch_s'] * 1e3:9.1f} {r['yardstick_s'] * 1e3:9.1f} {r['ratio']:6.2f} "
            f"{'yes' if r['bit_identical'] else 'NO':>5}  {r['yardstick']}"
        )
    return "\n".join(lines)
