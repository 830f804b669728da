"""Speed rows of `normlab bench` for `normlab.torch.quantize`, against its yardsticks.

Needs PyTorch (imported at the top of this module: [normlab.bench.command][] imports it
only when PyTorch is installed). Contract: every row first checks correctness (the timed
result bit for bit against the NumPy/numba `normlab.precision.quantize` on the same data,
and GPU against CPU), then times both sides with
[alternate][normlab.bench.timing.alternate], `repeats` rounds after a warm-up, so a busy
spell of a shared machine hits both; the table gives the ratio of the medians and of the
minima (the quietest sample of each). Yardsticks (targets): CPU float32 ->
`normlab.precision.quantize` (numba kernel; within 3x); CUDA -> a plain
`t.to(torch.float8_e4m3fn).float()` round trip (within 2x).

Notes
-----
torch's CPU allocator does not ask for transparent huge pages unless
`THP_MEM_ALLOC_ENABLE=1` is set before torch starts, while NumPy does for large arrays;
`normlab.torch.quantize` advises its large CPU outputs itself, so both sides pay the same
page faults. Torch's intra-op threads start one parallel region per op: on a machine whose
cores are busy with other processes each region waits for a core. The chunk loop then
switches to one chunk (fewer regions, more memory traffic), but the torch side still slows
down more than the one-region numba kernel (compare `ratio` with `min`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from normlab.bench.timing import Alternation, alternate
from normlab.precision import quantize as np_quantize
from normlab.torch import quantize

__all__ = ["format_rows", "quantize_rows"]


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _row(op: str, shape: Sequence[int], device: str, yardstick: str, times: Alternation,
         same: bool) -> dict[str, Any]:
    t_torch, t_ref = (float(np.median(s)) for s in (times.a_s, times.b_s))
    return {"op": op, "shape": list(shape), "device": device, "torch_s": t_torch,
            "yardstick": yardstick, "yardstick_s": t_ref, "ratio": times.ratio_of_medians,
            "ratio_min": times.ratio_of_minima, "bit_identical": same}


def quantize_rows(
    shape: Sequence[int] = (8192, 4096),
    fmts: Sequence[str] = ("bf16", "e4m3"),
    *,
    repeats: int = 5,
    seed: int = 0,
    small: Sequence[int] | None = (64, 512),
) -> list[dict[str, Any]]:
    """Time `normlab.torch.quantize` (nearest) on float32 `shape` against its yardsticks.

    Parameters
    ----------
    shape : sequence of int, optional
        The tensor shape (R, C). Default (8192, 4096).
    fmts : sequence of str, optional
        Format names, each one CPU row (and one CUDA row when a GPU is present).
    repeats : int, optional
        Alternating rounds per measurement (median and minimum reported). Default 5.
    seed : int, optional
        Seed of the standard-normal data (times 4, as the NumPy rows of the bench).
    small : sequence of int or None, optional
        A second, small CPU shape (per-call overhead; each sample repeats the call until
        it covers about $2^{20}$ elements, at most 1000 times), or None for none.

    Returns
    -------
    rows : list of dict
        `op`, `shape`, `device`, `torch_s` (normlab.torch.quantize, median), `yardstick`
        (what it is compared with), `yardstick_s` (median), `ratio` (of the medians),
        `ratio_min` (of the minima) and `bit_identical` (against the NumPy side, and for
        CUDA also against the CPU result).

    Examples
    --------
    >>> rows = quantize_rows((64, 64), ("bf16",), repeats=1, small=None)
    >>> rows[0]["bit_identical"]
    True
    """
    rows = []
    for k, size in enumerate((shape,) if small is None else (shape, small)):
        x = np.random.default_rng(seed).standard_normal(tuple(size), dtype=np.float32) * 4
        t = torch.from_numpy(x)
        inner = min(1000, max(1, 2**20 // max(x.size, 1))) if k else 1
        for fmt in fmts:
            want = np_quantize(x, fmt).view(np.uint32)
            cpu = quantize(t, fmt)
            same = bool(np.array_equal(cpu.numpy().view(np.uint32), want))
            times = alternate(_bind(quantize, t, fmt), _bind(np_quantize, x, fmt),
                              rounds=repeats, inner=inner)
            rows.append(_row(f"torch quantize {fmt} nearest", size, "cpu",
                             "normlab.precision.quantize (numba)", times, same))
            if torch.cuda.is_available() and not k:
                rows.append(_cuda_row(t, fmt, cpu, repeats))
    return rows


def _cuda_row(t: torch.Tensor, fmt: str, cpu: torch.Tensor, repeats: int) -> dict[str, Any]:
    g = t.cuda()
    same = torch.equal(quantize(g, fmt).cpu().view(torch.int32), cpu.view(torch.int32))
    times = alternate(lambda: quantize(g, fmt), lambda: g.to(torch.float8_e4m3fn).float(),
                      rounds=repeats, sync=torch.cuda.synchronize)
    return _row(f"torch quantize {fmt} nearest", list(t.shape), "cuda",
                "t.to(float8_e4m3fn).float()", times, bool(same))


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a plain-text table (milliseconds).

    Parameters
    ----------
    rows : sequence of dict
        Rows of [quantize_rows][normlab.bench.torch_quantize.quantize_rows].

    Returns
    -------
    text : str
        A header, a rule and one line per row.

    Examples
    --------
    >>> print(format_rows([]).splitlines()[0])  # doctest: +ELLIPSIS
    op ...
    """
    head = (f"{'op':30} {'shape':>10} {'device':>6} {'torch ms':>9} {'yard ms':>9} "
            f"{'ratio':>6} {'min':>6} {'exact':>5}  yardstick")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['op']:30} {'x'.join(map(str, r['shape'])):>10} {r['device']:>6} "
            f"{r['torch_s'] * 1e3:9.3f} {r['yardstick_s'] * 1e3:9.3f} {r['ratio']:6.2f} "
            f"{r['ratio_min']:6.2f} {'yes' if r['bit_identical'] else 'NO':>5}  "
            f"{r['yardstick']}"
        )
    return "\n".join(lines)
