"""`normlab inspect LOG.jsonl --out DIR`: an inspector log as `report.html` with figures.

Contract: [write_report][normlab.lab.inspect_report.write_report] reads nothing but the
records it is given and writes into `DIR`: `report.html` (self-contained: the figures are
embedded PNGs), `recommendation.py` (the `convert` calls) and `worst_layers.csv`. The page
holds, per recipe, layer x step heatmaps of underflow, overflow and SQNR (one panel per
tensor: input, weight, output gradient), a per-recipe comparison (each layer's worst lost
fraction and lowest SQNR under every recipe), the table of the worst operands, and the
layers to keep in high precision, printed as a `convert` mapping ready to paste
(`normlab.lab.inspect_log` has the rule).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from normlab.lab.inspect_log import (
    TENSORS,
    flagged,
    ranked,
    read_log,
    recommendation,
    summarise,
)
from normlab.lab.plotting import figure_png, new_figure

__all__ = ["SQNR_CAP_DB", "run_inspect", "write_report"]

SQNR_CAP_DB = 80.0
"""SQNR above this (exact operands: inf) is drawn at this value in the heatmaps."""
_WORST_ROWS = 15


def _modules(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["module"] for r in records))


def _grid(records: Sequence[Mapping[str, Any]], recipe: str, tensor: str, field: str,
          modules: list[str], steps: list[int]) -> list[list[float]]:
    cell = {(r["module"], r["step"]): r[field] for r in records
            if r["recipe"] == recipe and r["tensor"] == tensor}
    rows = []
    for m in modules:
        row = []
        for s in steps:
            v = cell.get((m, s), math.nan)
            if field == "sqnr_db" and v > SQNR_CAP_DB:
                v = SQNR_CAP_DB
            row.append(100.0 * v if field != "sqnr_db" else v)
        rows.append(row)
    return rows


def _label(recipe: str, recipes: Sequence[str]) -> str:
    """The recipe's class name, or its whole `repr` when two recipes share the class."""
    short = recipe.split("(", 1)[0]
    return short if sum(r.split("(", 1)[0] == short for r in recipes) == 1 else recipe


def _heatmaps(records: Sequence[Mapping[str, Any]], recipe: str, field: str) -> bytes:
    modules, steps = _modules(records), sorted({r["step"] for r in records})
    fig, axes = new_figure(1, 3, width=3.4, height=1.6 + 0.22 * len(modules))
    cmap = "viridis" if field == "sqnr_db" else "magma_r"
    label = {"underflow": "underflow (%)", "overflow": "overflow (%)",
             "sqnr_db": f"SQNR (dB, capped at {SQNR_CAP_DB:g})"}[field]
    grids = [_grid(records, recipe, t, field, modules, steps) for t in TENSORS]
    seen = [v for g in grids for row in g for v in row if not math.isnan(v)]
    top = max(seen, default=1.0)
    low = min(seen, default=0.0) if field == "sqnr_db" else 0.0
    image = None
    for ax, tensor, grid in zip(axes, TENSORS, grids, strict=True):
        image = ax.imshow(grid, aspect="auto", cmap=cmap, interpolation="nearest",
                          vmin=low, vmax=top if top > low else low + 1.0)
        ax.set_title(tensor, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ticks = range(0, len(steps), max(1, len(steps) // 10))
        ax.set_xticks(list(ticks), [str(steps[i]) for i in ticks], fontsize=6)
        ax.set_yticks(range(len(modules)), modules if tensor == "input" else [""] * len(modules),
                      fontsize=6)
    fig.colorbar(image, ax=list(axes), shrink=0.9).ax.tick_params(labelsize=6)
    fig.suptitle(f"{label}: {recipe}", fontsize=9)
    return figure_png(fig)


def _comparison(summaries: Sequence[Any]) -> bytes:
    recipes = list(dict.fromkeys(s.recipe for s in summaries))
    modules = list(dict.fromkeys(s.module for s in summaries))
    fig, (left, right) = new_figure(1, 2, width=5.0, height=1.8 + 0.25 * len(modules))
    for i, recipe in enumerate(recipes):
        lost = {m: 0.0 for m in modules}
        sqnr = {m: math.inf for m in modules}
        for s in summaries:
            if s.recipe == recipe:
                lost[s.module] = max(lost[s.module], 100.0 * s.lost)
                sqnr[s.module] = min(sqnr[s.module], s.sqnr_db)
        ys = [j + (i - (len(recipes) - 1) / 2) * 0.8 / len(recipes) for j in range(len(modules))]
        name = _label(recipe, recipes)
        left.barh(ys, [lost[m] for m in modules], height=0.8 / len(recipes), label=name)
        right.plot([min(sqnr[m], SQNR_CAP_DB) for m in modules], range(len(modules)), "o-",
                   label=name, markersize=3)
    left.set_yticks(range(len(modules)), modules, fontsize=6)
    left.invert_yaxis()
    left.set_xlabel("worst operand: underflow + overflow (%)", fontsize=8)
    right.set_yticks(range(len(modules)), [""] * len(modules))
    right.invert_yaxis()
    right.set_xlabel(f"worst operand: median SQNR (dB, capped at {SQNR_CAP_DB:g})", fontsize=8)
    fig.legend(*left.get_legend_handles_labels(), loc="outside lower center",
               ncols=min(len(recipes), 3), fontsize=6)
    fig.suptitle("per-recipe comparison, per layer", fontsize=9)
    return figure_png(fig)


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:.2f}%" if pct else f"{v:.1f}"


def write_report(records: Sequence[Mapping[str, Any]], out: str | Path, *,
                 lost_margin: float = 0.02, sqnr_margin: float = 6.0) -> dict[str, str]:
    """Write `report.html`, `recommendation.py` and `worst_layers.csv` into `out`.

    Parameters
    ----------
    records : sequence of dict
        Inspector records ([read_log][normlab.lab.inspect_log.read_log]).
    out : str or pathlib.Path
        The folder (created with its parents; files of the same names are replaced).
    lost_margin, sqnr_margin : float, optional
        The flagging rule of [flagged][normlab.lab.inspect_log.flagged].

    Returns
    -------
    recommendations : dict
        recipe -> the `convert` source that keeps its flagged layers in high precision.
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    summaries = summarise(records)
    flags = flagged(summaries, lost_margin=lost_margin, sqnr_margin=sqnr_margin)
    recs = {recipe: recommendation(recipe, keep) for recipe, keep in flags.items()}
    worst = ranked(summaries)
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             "<title>normlab inspect</title><style>body{font-family:sans-serif;max-width:70em;"
             "margin:auto;padding:0 1em}img{max-width:100%}table{border-collapse:collapse;"
             "font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}</style></head><body>",
             "<h1>Numerics inspector report</h1>",
             f"<p>{len(records)} records, {len(_modules(records))} layers, "
             f"{len({r['step'] for r in records})} recorded steps, {len(flags)} recipe(s). "
             f"A layer is flagged when an operand loses (underflow + overflow, mean over "
             f"steps) more than {100 * lost_margin:g} percentage points above the median "
             f"of that tensor under the recipe across the layers, or its median SQNR lies "
             f"more than {sqnr_margin:g} dB below the median SQNR.</p>",
             "<h2>Recommendation</h2>"]
    for recipe, keep in flags.items():
        parts.append(f"<h3>{html.escape(recipe)}</h3><p>{len(keep)} layer(s) to keep in high "
                     "precision.</p>")
        parts.append(f"<pre>{html.escape(recs[recipe])}</pre>")
    parts.append("<h2>Worst operands</h2><table><tr><th>module</th><th>tensor</th>"
                 "<th>recipe</th><th>underflow</th><th>overflow</th><th>SQNR (dB)</th>"
                 "<th>below typical (dB)</th><th>worst block range (binades)</th></tr>")
    for s, short in worst[:_WORST_ROWS]:
        parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
            s.module, s.tensor, _label(s.recipe, list(flags)), _fmt(s.underflow, True),
            _fmt(s.overflow, True), _fmt(s.sqnr_db), _fmt(short),
            _fmt(s.worst_block_range))) + "</tr>")
    parts.append("</table><h2>Per-recipe comparison</h2>")
    parts.append(_img(_comparison(summaries), "per-recipe comparison"))
    for recipe in flags:
        parts.append(f"<h2>Heatmaps: {html.escape(recipe)}</h2>")
        for field in ("underflow", "overflow", "sqnr_db"):
            parts.append(_img(_heatmaps(records, recipe, field), f"{field} heatmap"))
    parts.append("</body></html>")
    (folder / "report.html").write_text("\n".join(parts), encoding="utf-8")
    (folder / "recommendation.py").write_text(
        "\n\n".join(f"# {recipe}\n{src}" for recipe, src in recs.items()) + "\n",
        encoding="utf-8")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["module", "tensor", "recipe", "underflow", "overflow", "sqnr_db",
                     "sqnr_below_typical_db", "worst_block_range"])
    for s, short in worst:
        writer.writerow([s.module, s.tensor, s.recipe, s.underflow, s.overflow, s.sqnr_db,
                         short, s.worst_block_range])
    (folder / "worst_layers.csv").write_text(buffer.getvalue(), encoding="utf-8")
    return recs


def run_inspect(log: str | Path, out: str | Path, *, lost_margin: float = 0.02,
                sqnr_margin: float = 6.0) -> str:
    """Read `log`, write the report into `out`, return the text the command prints.

    Raises
    ------
    LogError
        If the log is malformed ([read_log][normlab.lab.inspect_log.read_log]).
    ValueError
        If `out` is a file.
    """
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; name a folder")
    records = read_log(log)
    recs = write_report(records, out, lost_margin=lost_margin, sqnr_margin=sqnr_margin)
    worst = ranked(summarise(records))[:5]
    lines = ["worst operands (underflow + overflow, SQNR):"]
    lines += [f"  {s.module:30s} {s.tensor:12s} {s.recipe.split('(', 1)[0]:18s} "
              f"{100 * s.lost:6.2f}%  {s.sqnr_db:6.1f} dB" for s, _ in worst]
    for recipe, src in recs.items():
        lines += ["", f"# {recipe}", src]
    lines += ["", f"report: {Path(out) / 'report.html'}"]
    return "\n".join(lines)
