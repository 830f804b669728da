"""The benchmark's report: an aligned text or markdown table, the header and the warnings.

Contract: rows are the dicts the cases build (`op`, `shape`, and for each of `normlab`,
`numpy`, `torch`, `ml_dtypes` the fields `<who>_s` (median seconds per call),
`<who>_min_s` and `<who>_spread` from [measure][normlab.bench.timing.measure], plus
`bound_s` / `bound_alloc_s` where a bandwidth bound applies). Ratios "A / normlab" above 1
mean normlab is faster; "normlab / bound" is how far normlab is from moving its bytes at
the copy bandwidth (for rows with `bound_ratio`, timed in alternation with the copy of the
same bytes, that median of the rounds' ratios).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from normlab.bench.timing import SPREAD_WARN

__all__ = ["format_seconds", "render", "report", "table"]

_COLUMNS = ("op (float32)", "shape", "normlab median", "normlab min", "spread",
            "NumPy ref", "PyTorch", "ml_dtypes", "bound", "normlab / bound",
            "normlab / bound+new", "PyTorch / normlab", "ml_dtypes / normlab")
_OP_NAMES = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm", "batch_norm": "BatchNorm",
             "group_norm": "GroupNorm"}


def format_seconds(v: float | None) -> str:
    """Seconds as "12.3 us" below a millisecond, else "12.3 ms"; None as "-".

    Parameters
    ----------
    v : float or None
        Seconds.

    Returns
    -------
    text : str
        The formatted time.
    """
    if v is None:
        return "-"
    return f"{v * 1e6:.1f} us" if v < 1e-3 else f"{v * 1e3:.1f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def _bound_ratios(r: dict[str, Any]) -> list[str]:
    """normlab / bound and / bound+new; a row timed against the copy shows its round median."""
    if "bound_ratio" in r:
        return [f"{r['bound_ratio']:.2f}x"] * 2  # out= rows: nothing new, one bound
    nls = r.get("normlab_s")
    return [_ratio(nls, r.get("bound_s")), _ratio(nls, r.get("bound_alloc_s"))]


def _cells(r: dict[str, Any]) -> list[str]:
    nls = r.get("normlab_s")
    first, rest = r["op"].split(" ", 1)  # "layer_norm fwd+bwd" -> "LayerNorm fwd+bwd"
    spread = r.get("normlab_spread")
    times = [format_seconds(r.get(k)) for k in ("normlab_s", "normlab_min_s")]
    others = [format_seconds(r.get(k)) for k in ("numpy_s", "torch_s", "ml_dtypes_s", "bound_s")]
    return [f"{_OP_NAMES.get(first, first)} {rest}", "x".join(map(str, r["shape"])), *times,
            "-" if spread is None else f"{100 * spread:.0f}%", *others,
            *_bound_ratios(r),
            _ratio(r.get("torch_s"), nls), _ratio(r.get("ml_dtypes_s"), nls)]


def render(columns: Sequence[str], body: Sequence[Sequence[str]], markdown: bool = False) -> str:
    """Cells as an aligned text table (first column left, the others right), or markdown.

    Parameters
    ----------
    columns : sequence of str
        The header cells.
    body : sequence of sequence of str
        One sequence of cells per row, as many as `columns`.
    markdown : bool, optional
        A markdown table instead of aligned text. Default False.

    Returns
    -------
    text : str
        The header, a rule and one line per row.

    Examples
    --------
    >>> print(render(["op", "time"], [["copy", "1.0 ms"]]))
    op    time
    ----------
    copy  1.0 ms
    """
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in body])
    widths = [max(len(c[i]) for c in [list(columns), *body]) for i in range(len(columns))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    head = fmt.format(*columns)
    return "\n".join([head, "-" * len(head), *(fmt.format(*c) for c in body)])


def table(rows: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """The kernel rows as an aligned text table, or a markdown table.

    Parameters
    ----------
    rows : sequence of dict
        Rows of the cases.
    markdown
        As in [render][normlab.bench.table.render].

    Returns
    -------
    text : str
        The table, one line per row after the header.
    """
    return render(_COLUMNS, [_cells(r) for r in rows], markdown)


def _noise_warnings(rows: Sequence[dict[str, Any]], load: tuple[float, int] | None) -> list[str]:
    """Warnings for noisy timings (spread > SPREAD_WARN) and for other load on the cores."""
    out = []
    if load is not None and load[0] > max(0.5, 0.25 * load[1]):
        out.append(f"WARNING: other load on this machine (1-minute load average {load[0]:.2f} "
                   f"on {load[1]} cores): absolute times are inflated; compare ratios "
                   "measured in this run")
    noisy = [(r[f"{who}_spread"], f"{who} {r['op']} {'x'.join(map(str, r['shape']))}")
             for r in rows for who in ("normlab", "numpy", "torch", "ml_dtypes")
             if r.get(f"{who}_spread", 0.0) > SPREAD_WARN]
    if noisy:
        worst = ", ".join(f"{name} {100 * sp:.0f}%" for sp, name in sorted(noisy)[::-1][:3])
        out.append(f"WARNING: {len(noisy)} timings have a spread above "
                   f"{100 * SPREAD_WARN:.0f}% (worst: {worst}); their medians are noisy")
    return out


def _header(info: dict[str, Any]) -> str:
    load = info["load_average_1min"]
    return (f"cores {info['cpu_count']}, numba threads {info['numba_threads']}, torch threads "
            f"{info['torch_threads']}, load average {'-' if load is None else f'{load:.2f}'}; "
            f"copy bandwidth {info['copy_bandwidth_GBps']:.1f} GB/s into an existing array, "
            f"{info['copy_to_new_array_GBps']:.1f} GB/s into a new one")


def report(info: dict[str, Any], rows: list[dict[str, Any]], ok: bool, markdown: bool,
            load: tuple[float, int] | None) -> None:
    """Print the header, the table, the checks' verdict, memory, compile times, warnings.

    Parameters
    ----------
    info : dict
        The run's machine facts (cores, threads, load, bandwidths, compile times).
    rows : list of dict
        Rows of the cases.
    ok : bool
        Whether every correctness check passed.
    markdown : bool
        Print the table as markdown.
    load : tuple of (float, int) or None
        The highest load average seen during the run, and the core count.
    """
    print(_header(info))
    print(table(rows, markdown))
    verdict = ("ok" if ok else "FAILED") if info["kernels"] else "not checked (no kernels)"
    print("correctness:", verdict, "(norm errors in units of 16 eps32 sqrt(n) max|ref|, n "
          "the values per reduction; "
          "quantize bit-identical to the reference on the rows it was timed on; its "
          "NumPy time is scaled from those rows to the whole array)")
    print("spread = interquartile range / median of the samples; 'bound' = bytes that must "
          "move / copy bandwidth; 'bound+new' adds the zero-fill of freshly allocated outputs; "
          "norm out= rows: timed in alternation with an all-core copy of x, the ratio is the "
          "median over rounds; A / normlab > 1 means normlab is faster")
    for r in rows:
        if "normlab_peak_extra_bytes" in r:
            print(f"peak extra memory {r['op']} {r['shape']}: normlab "
                  f"{r['normlab_peak_extra_bytes'] / r['outputs_bytes']:.3f} x (out + dx), "
                  f"numpy {r['numpy_peak_extra_bytes'] / r['outputs_bytes']:.2f} x")
    if "compile" in info:
        c = info["compile"]
        print(f"import + first calls in a new process: {c['cold_cache_s']:.2f} s with an "
              f"empty kernel cache, {c['warm_cache_s']:.2f} s with a warm one")
    for line in _noise_warnings(rows, load):
        print(line)
