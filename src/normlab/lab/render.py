"""Render the outcomes of a lab run as markdown and as one self-contained HTML page.

Both documents come from the same blocks: for each experiment a markdown text (title,
status, summary, the claim-beside-measurement table, the experiment's own tables, or the
traceback of an error, folded) followed by its figures. The markdown links the PNG files;
the HTML embeds the same PNG bytes as base64 `data:` URIs and carries its CSS inline, so
the page needs no other file and no network. Every table is built with
[normlab.lab.tables.markdown_table][] (escaped cells); the summary rows link to their
sections; the "reproduce" lines carry the flags the report was made with; the page is
laid out for phone widths (390 px) without sideways scrolling: wide tables and code blocks
scroll inside their own box, long words wrap.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from normlab.lab._markdown import to_html
from normlab.lab.replicates import Interval
from normlab.lab.runner import Outcome
from normlab.lab.tables import escape_cell, markdown_table

__all__ = [
    "RenderedFigure",
    "cli_flags",
    "experiment_markdown",
    "html_document",
    "interval_cell",
    "markdown_document",
    "verdict_summary",
]

_STATUS = {"pass": "PASS", "fail": "FAIL", "not reproduced": "NOT REPRODUCED",
           "inconclusive": "INCONCLUSIVE", "skipped": "SKIPPED", "error": "ERROR"}

_CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif;
       max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; line-height: 1.45;
       overflow-wrap: anywhere; }
h1, h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.table-wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .92rem; }
th, td { border: 1px solid #ccc; padding: .3rem .55rem; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .88rem; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: .6rem; overflow-x: auto;
      max-width: 100%; overflow-wrap: normal; }
details { margin: .6rem 0; }
summary { cursor: pointer; }
.pass { color: #11692b; font-weight: 700; }
.fail { color: #b00020; font-weight: 700; }
.notrep { color: #8a5a00; font-weight: 700; }
.inconc { color: #4a4a8a; font-weight: 700; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
@media (max-width: 600px) { body { margin: 1rem auto; padding: 0 .5rem; }
  table { font-size: .8rem; } th, td { padding: .2rem .3rem; } }
figcaption { font-size: .85rem; color: #555; }
"""


@dataclass(frozen=True)
class RenderedFigure:
    """One figure of an experiment: its file (relative to the report) and its PNG bytes.

    Attributes
    ----------
    stem : str
        The figure's name within its experiment (`"lemma2"`).
    relpath : str
        Its file, relative to the report folder (`"figures/xiong_init-lemma2.png"`).
    png : bytes
        The PNG file's bytes.
    """

    stem: str
    relpath: str
    png: bytes


def _status_word(outcome: Outcome) -> str:
    return _STATUS[outcome.status]


def cli_flags(size: object, seed: object) -> str:
    """The command-line flags that select `size` and `seed` (empty for the defaults).

    Examples
    --------
    >>> cli_flags("quick", 2), cli_flags("default", 0)
    (' --quick --seed 2', '')
    """
    flags = {"quick": " --quick", "full": " --full"}.get(str(size), "")
    return flags + (f" --seed {seed}" if seed not in (0, None) else "")


def _error_block(outcome: Outcome) -> list[str]:
    """The traceback, folded: its last line is the summary, the whole text inside."""
    text = (outcome.error or "").rstrip()
    last = text.splitlines()[-1] if text else "no traceback recorded"
    return [
        "**ERROR**: the experiment raised an exception.",
        "",
        "<details>",
        f"<summary>{escape_cell(last)} (traceback)</summary>",
        "",
        "```",
        *text.replace("```", "` ` `").splitlines(),  # a fence inside would end the block
        "```",
        "",
        "</details>",
        "",
    ]


def interval_cell(interval: Interval | None) -> str:
    """The effect, its interval, the replicates and what each one is, for a check's row.

    "exact check" for a check without replicates (a mechanism checked exactly).

    Examples
    --------
    >>> from normlab.lab.replicates import t_interval
    >>> interval_cell(t_interval([1.0, 2.0, 3.0], "final loss of one seed"))
    '2 [-0.484, 4.48], n = 3 (mean of: final loss of one seed; t interval)'
    """
    if interval is None:
        return "exact check"
    kind = "mean" if interval.method == "t" else "median"
    return (f"{interval.text()} ({kind} of: {interval.averaged}; "
            f"{'t' if interval.method == 't' else 'order-statistic'} interval)")


def _detects_block(outcome: Outcome) -> list[str]:
    if not outcome.detects:
        return ["Known to detect: no fault-injection test yet.", ""]
    head = "Known to detect (each break is shown to give FAIL by a fault-injection test):"
    return [head, "", *(f"- {escape_cell(d)}" for d in outcome.detects), ""]


def experiment_markdown(index: int, outcome: Outcome, size: object = None) -> str:
    """The markdown of one experiment, without its figures.

    `size` (`"quick"`, `"default"`, `"full"`) puts its flag in the reproduce line.
    """
    seed = outcome.result.seed if outcome.result is not None else None
    lines = [
        f'<a id="{outcome.name}"></a>',
        "",
        f"## {index}. {outcome.title}",
        "",
        f"`normlab run {outcome.name}{cli_flags(size, seed)}` · "
        f"seed {seed if seed is not None else 'n/a'} · "
        f"{outcome.elapsed_s:.1f} s · **{_status_word(outcome)}**",
        "",
    ]
    if outcome.status == "skipped":
        reason = escape_cell(outcome.error or "an optional dependency is missing")
        return "\n".join([*lines, f"**SKIPPED**: {reason}", "", *_detects_block(outcome)])
    if outcome.status == "error" or outcome.result is None:
        return "\n".join(lines + _error_block(outcome) + _detects_block(outcome))
    result = outcome.result
    if result.summary:
        lines += [result.summary.strip(), ""]
    if result.checks:
        header = ["paper", "claim", "measured here", "criterion", "effect [95% interval]",
                  "result"]
        rows = [[c.source, c.claim, c.measured, c.criterion, interval_cell(c.interval),
                 c.verdict] for c in result.checks]
        lines += [markdown_table(header, rows), ""]
    else:
        lines += ["**FAIL**: the experiment reported no check.", ""]
    for table in result.tables:
        lines += [table.strip(), ""]
    if result.settings:
        used = ", ".join(f"{k} = {escape_cell(v)}" for k, v in result.settings.items())
        lines += [f"Sizes used: {used}.", ""]
    return "\n".join(lines + _detects_block(outcome))


_SUMMARY_ORDER = ("pass", "not reproduced", "inconclusive", "skipped", "error", "fail")
_INSTALL = re.compile(r'pip install (?:"[^"]+"|\S+)')


def verdict_summary(outcomes: Sequence[Outcome]) -> str:
    """One line that counts each verdict: `8 PASS · 4 NOT REPRODUCED · 0 FAIL`.

    PASS and FAIL are always counted; every other status (NOT REPRODUCED, INCONCLUSIVE,
    SKIPPED, ERROR, and any the runner adds) only when it occurs. SKIPPED carries the
    install command(s) its experiments named, so the line says how to run them.

    Parameters
    ----------
    outcomes : sequence of Outcome
        The runner's outcomes ([Outcome][normlab.lab.runner.Outcome]).

    Returns
    -------
    str
        The counts, in the order PASS, NOT REPRODUCED, INCONCLUSIVE, SKIPPED, ERROR, FAIL
        (other statuses before FAIL), joined by " · ".

    Examples
    --------
    >>> from types import SimpleNamespace as O
    >>> verdict_summary([O(status="pass", error=None), O(status="not reproduced", error=None)])
    '1 PASS · 1 NOT REPRODUCED · 0 FAIL'
    """
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    order = [s for s in _SUMMARY_ORDER if s != "fail"]
    order += [s for s in counts if s not in _SUMMARY_ORDER] + ["fail"]
    parts = []
    for status in order:
        n = counts.get(status, 0)
        if n == 0 and status not in ("pass", "fail"):
            continue
        part = f"{n} {status.upper()}"
        if status == "skipped":
            hints = dict.fromkeys(
                m.group(0) for o in outcomes if o.status == "skipped"
                for m in _INSTALL.finditer(o.error or "")
            )
            if hints:
                part += f" ({', '.join(hints)})"
        parts.append(part)
    return " · ".join(parts)


def _header(outcomes: Sequence[Outcome], meta: Mapping[str, object]) -> str:
    lines = [
        "# normlab report",
        "",
        "Each paper's claim beside the value measured here, with PASS/FAIL (NOT REPRODUCED: "
        "the lab works, the claim measurably does not hold in this setting; INCONCLUSIVE: "
        "the measured effect is below what this run can resolve). "
        "Everything below was computed on this machine from embedded data; seeds are fixed. "
        "A claim that depends on random draws is measured over independent replicates (seeds "
        "derived from the report's seed) and decided from its 95% interval: PASS when the "
        "interval clears the criterion, NOT REPRODUCED when it excludes it, INCONCLUSIVE "
        "when it straddles it.",
        "",
        f"- settings: size `{meta['size']}`, seed `{meta['seed']}`",
        f"- reproduce: `normlab report{cli_flags(meta['size'], meta['seed'])}`",
        f"- versions: {meta['versions_text']}",
        f"- generated: {meta['generated']} (total {meta['total_s']:.1f} s wall"
        + (f", {meta['cpu_s']:.1f} s CPU" if meta.get("cpu_s") is not None else "") + ")",
        f"- result: **{verdict_summary(outcomes)}**",
        "",
    ]
    rows = []
    for i, o in enumerate(outcomes, 1):
        checks = o.result.checks if o.result is not None else []
        title = o.title.replace("[", "(").replace("]", ")")  # keep the link text plain
        rows.append([i, f"[{title}](#{o.name}) (`{o.name}`)", _status_word(o),
                     f"{sum(c.passed for c in checks)} / {len(checks)}",
                     f"{o.elapsed_s:.1f}"])
    header = ["#", "experiment", "result", "checks passed", "time (s)"]
    return "\n".join([*lines, markdown_table(header, rows), ""])


def markdown_document(
    outcomes: Sequence[Outcome],
    figures: Mapping[str, Sequence[RenderedFigure]],
    meta: Mapping[str, object],
) -> str:
    """The whole `report.md`: header, summary table, then each experiment and its figures."""
    parts = [_header(outcomes, meta)]
    for i, o in enumerate(outcomes, 1):
        parts.append(experiment_markdown(i, o, meta.get("size")))
        for fig in figures.get(o.name, ()):
            parts.append(f"![{o.name}: {fig.stem}]({fig.relpath})\n")
    return "\n".join(parts)


def html_document(
    outcomes: Sequence[Outcome],
    figures: Mapping[str, Sequence[RenderedFigure]],
    meta: Mapping[str, object],
) -> str:
    """The whole `report.html`: same content as the markdown, figures embedded as base64."""
    body = [to_html(_header(outcomes, meta))]
    for i, o in enumerate(outcomes, 1):
        body.append("<section>")  # the id is the anchor at the top of the experiment's text
        body.append(to_html(experiment_markdown(i, o, meta.get("size"))))
        for fig in figures.get(o.name, ()):
            data = base64.b64encode(fig.png).decode("ascii")
            caption = html.escape(f"{o.name}: {fig.stem} ({fig.relpath})")
            body.append(
                f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        body.append("</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>normlab report</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )
