"""Reading an inspector log, ranking its layers, and the `convert` mapping it recommends.

Contract: [read_log][normlab.lab.inspect_log.read_log] reads the JSON lines that
[normlab.torch.inspect][] writes and checks every record (a malformed one raises
[LogError][normlab.lab.inspect_log.LogError], one line naming the file and the line);
[summarise][normlab.lab.inspect_log.summarise] joins the steps of each (module, tensor,
recipe); [flagged][normlab.lab.inspect_log.flagged] picks, per recipe, the layers to keep in
high precision; [recommendation][normlab.lab.inspect_log.recommendation] prints them as a
`convert` call ready to paste. Nothing here imports torch or matplotlib.

The rule (fixed before looking at any model) flags outliers, the layers where a recipe
does unusually badly, since every operand of a 4-bit recipe loses some values: an operand
loses information when, averaged over the recorded steps, its lost fraction (underflow +
overflow) exceeds the median lost fraction of the same tensor under the same recipe across
the layers by more than `lost_margin` (default 0.02: two percentage points), or its median
SQNR lies more than `sqnr_margin` dB (default 6 dB: four times the error power) below the
median SQNR of the same tensor under the same recipe. A layer with such an operand is
flagged. The worst-operand ranking sorts by the lost fraction, then by the SQNR shortfall.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LogError", "OperandSummary", "flagged", "ranked", "read_log", "recommendation",
           "shortfall", "summarise"]

TENSORS = ("input", "weight", "grad_output")
"""The operands a record can name."""
_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,), "module": (str,), "tensor": (str,), "recipe": (str,), "format": (str,),
    "underflow": (int, float), "overflow": (int, float), "sqnr_db": (int, float),
    "amax": (int, float),
}


class LogError(ValueError):
    """A log that cannot be read as inspector records (the message is one line)."""


def _check(rec: Any, where: str) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise LogError(f"{where}: expected a JSON object (a record), got {type(rec).__name__}")
    for key, types in _FIELDS.items():
        value = rec.get(key)
        if key not in rec or isinstance(value, bool) or not isinstance(value, types):
            names: dict[tuple[type, ...], str] = {(int,): "an integer", (str,): "a string"}
            want = names.get(types, "a number")
            raise LogError(f"{where}: field {key!r} must be {want}; got {value!r}")
    if rec["tensor"] not in TENSORS:
        raise LogError(f"{where}: field 'tensor' must be one of {list(TENSORS)}; "
                       f"got {rec['tensor']!r}")
    for key in ("underflow", "overflow"):
        if not 0.0 <= rec[key] <= 1.0:
            raise LogError(f"{where}: field {key!r} must be a fraction in [0, 1]; got {rec[key]!r}")
    return rec


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of an inspector log (JSON lines), checked.

    Parameters
    ----------
    path : str or pathlib.Path
        The file `inspect(..., path=...)` wrote.

    Returns
    -------
    records : list of dict
        One dict per line, in the file's order.

    Raises
    ------
    LogError
        If the file cannot be read, a line is not a JSON record with the fields and types
        of the inspector's records, or there is no record.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LogError(f"cannot read {str(path)!r}: {exc}") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LogError(f"{path}:{n}: not JSON ({exc.msg})") from None
        records.append(_check(rec, f"{path}:{n}"))
    if not records:
        raise LogError(f"{path}: no records (an inspector log has one JSON object per line)")
    return records


@dataclass(frozen=True)
class OperandSummary:
    """One (module, tensor, recipe) over the recorded steps.

    Attributes
    ----------
    module, tensor, recipe, format : str
        As in the records.
    steps : int
        Recorded steps.
    underflow, overflow : float
        Means over the steps.
    sqnr_db : float
        Median over the steps (inf when exact).
    worst_block_range : float or None
        Largest over the steps (block recipes).
    """

    module: str
    tensor: str
    recipe: str
    format: str
    steps: int
    underflow: float
    overflow: float
    sqnr_db: float
    worst_block_range: float | None

    @property
    def lost(self) -> float:
        """Mean fraction of values that underflow or overflow."""
        return self.underflow + self.overflow


def summarise(records: Iterable[Mapping[str, Any]]) -> list[OperandSummary]:
    """Each (module, tensor, recipe) joined over its steps, in the order of first appearance."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["module"], r["tensor"], r["recipe"]), []).append(r)
    out = []
    for (module, tensor, recipe), rs in groups.items():
        ranges = [r["worst_block_range"] for r in rs
                  if isinstance(r.get("worst_block_range"), (int, float))]
        sqnrs = [r["sqnr_db"] for r in rs if not math.isnan(r["sqnr_db"])]
        out.append(OperandSummary(
            module, tensor, recipe, rs[0]["format"], len(rs),
            statistics.fmean(r["underflow"] for r in rs),
            statistics.fmean(r["overflow"] for r in rs),
            statistics.median(sqnrs) if sqnrs else math.nan,
            max(ranges) if ranges else None))
    return out


def _typical(summaries: Sequence[OperandSummary]) -> dict[tuple[str, str], tuple[float, float]]:
    """Median lost fraction and median SQNR (finite values) per (recipe, tensor)."""
    lost: dict[tuple[str, str], list[float]] = {}
    sqnr: dict[tuple[str, str], list[float]] = {}
    for s in summaries:
        lost.setdefault((s.recipe, s.tensor), []).append(s.lost)
        if math.isfinite(s.sqnr_db):
            sqnr.setdefault((s.recipe, s.tensor), []).append(s.sqnr_db)
    return {k: (statistics.median(v), statistics.median(sqnr[k]) if k in sqnr else math.inf)
            for k, v in lost.items()}


def shortfall(s: OperandSummary, typical: Mapping[tuple[str, str], tuple[float, float]]
              ) -> float:
    """How many dB the operand's SQNR lies below its recipe's typical one (0 if above)."""
    ref = typical[(s.recipe, s.tensor)][1]
    if not math.isfinite(ref) or math.isnan(s.sqnr_db):
        return 0.0
    return max(ref - s.sqnr_db, 0.0)


def ranked(summaries: Sequence[OperandSummary]) -> list[tuple[OperandSummary, float]]:
    """The operands worst first (lost fraction, then SQNR shortfall), with the shortfall."""
    typical = _typical(summaries)
    pairs = [(s, shortfall(s, typical)) for s in summaries]
    return sorted(pairs, key=lambda p: (-p[0].lost, -p[1]))


def flagged(summaries: Sequence[OperandSummary], *, lost_margin: float = 0.02,
            sqnr_margin: float = 6.0) -> dict[str, dict[str, str]]:
    """Per recipe, the layers to keep in high precision and why (module header's rule).

    Returns
    -------
    flags : dict
        recipe -> {module: reason}, modules in the order of the log; every recipe of the
        log has an entry (possibly empty).
    """
    typical = _typical(summaries)
    flags: dict[str, dict[str, str]] = {s.recipe: {} for s in summaries}
    for s in summaries:
        short = shortfall(s, typical)
        usual = typical[(s.recipe, s.tensor)][0]
        why = []
        if s.lost > usual + lost_margin:
            why.append(f"{s.tensor} loses {100 * s.lost:.1f}% (underflow "
                       f"{100 * s.underflow:.1f}%, overflow {100 * s.overflow:.1f}%; "
                       f"typical {100 * usual:.1f}%)")
        if short > sqnr_margin:
            why.append(f"{s.tensor} SQNR {s.sqnr_db:.1f} dB, {short:.1f} dB below typical")
        if why:
            old = flags[s.recipe].get(s.module)
            flags[s.recipe][s.module] = "; ".join(([old] if old else []) + why)
    return flags


def recommendation(recipe: str, keep: Mapping[str, str]) -> str:
    """A `convert` call (Python source) that keeps the layers of `keep` out of `recipe`.

    `None` leaves a layer as it is (the model's own precision, e.g. bf16); the last
    pattern `"*"` gives every other layer the recipe.

    Examples
    --------
    >>> print(recommendation("MXRecipe(elem='e4m3')", {"fc2": "input loses 40%"}))
    from normlab.torch import convert
    from normlab.torch.recipes import MXRecipe
    <BLANKLINE>
    convert(model, {
        "fc2": None,  # input loses 40%
        "*": MXRecipe(elem='e4m3'),
    })
    """
    name = recipe.split("(", 1)[0]
    lines = ["from normlab.torch import convert",
             f"from normlab.torch.recipes import {name}", "", "convert(model, {"]
    lines += [f"    {json.dumps(m)}: None,  # {why}" for m, why in keep.items()]
    lines += [f'    "*": {recipe},', "})"]
    return "\n".join(lines)
