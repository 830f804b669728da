"""Render the outcomes of a lab run as markdown and as one self-contained HTML page.

Both documents come from the same blocks: for each experiment a markdown text (title,
status, summary, the claim-beside-measurement table, the experiment's own tables, or the
traceback of an error) followed by its figures. The markdown links the PNG files; the HTML
embeds the same PNG bytes as base64 ``data:`` URIs and carries its CSS inline, so the page
needs no other file and no network.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from normlab.lab._markdown import to_html
from normlab.lab.runner import Outcome

__all__ = ["RenderedFigure", "experiment_markdown", "html_document", "markdown_document"]

_STATUS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif;
       max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; line-height: 1.45; }
h1, h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .92rem; }
th, td { border: 1px solid #ccc; padding: .3rem .55rem; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .88rem; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: .6rem; overflow-x: auto; }
.pass { color: #11692b; font-weight: 700; }
.fail { color: #b00020; font-weight: 700; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
"""


@dataclass(frozen=True)
class RenderedFigure:
    """One figure of an experiment: its file (relative to the report) and its PNG bytes."""

    stem: str
    relpath: str
    png: bytes


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _status_word(outcome: Outcome) -> str:
    return _STATUS[outcome.status]


def experiment_markdown(index: int, outcome: Outcome) -> str:
    """The markdown of one experiment, without its figures."""
    lines = [f"## {index}. {outcome.title}", ""]
    seed = outcome.result.seed if outcome.result is not None else None
    lines.append(
        f"`normlab run {outcome.name}` · seed {seed if seed is not None else 'n/a'} · "
        f"{outcome.elapsed_s:.1f} s · **{_status_word(outcome)}**"
    )
    lines.append("")
    if outcome.status == "error" or outcome.result is None:
        lines += ["**ERROR**: the experiment raised an exception:", "", "```"]
        lines += (outcome.error or "").rstrip().splitlines()
        lines += ["```", ""]
        return "\n".join(lines)
    result = outcome.result
    if result.summary:
        lines += [result.summary.strip(), ""]
    if result.checks:
        lines += [
            "| paper | claim | measured here | criterion | result |",
            "|---|---|---|---|---|",
        ]
        for check in result.checks:
            word = "PASS" if check.passed else "FAIL"
            lines.append(
                f"| {_cell(check.source)} | {_cell(check.claim)} | {_cell(check.measured)} "
                f"| {_cell(check.criterion)} | {word} |"
            )
        lines.append("")
    else:
        lines += ["**FAIL**: the experiment reported no check.", ""]
    for table in result.tables:
        lines += [table.strip(), ""]
    if result.settings:
        used = ", ".join(f"{k} = {_cell(v)}" for k, v in result.settings.items())
        lines += [f"Sizes used: {used}.", ""]
    return "\n".join(lines)


def _header(outcomes: Sequence[Outcome], meta: Mapping[str, object]) -> str:
    passed = sum(o.status == "pass" for o in outcomes)
    lines = [
        "# normlab report",
        "",
        "Each paper's claim beside the value measured here, with PASS/FAIL. "
        "Everything below was computed on this machine from embedded data; seeds are fixed.",
        "",
        f"- settings: size `{meta['size']}`, seed `{meta['seed']}`",
        f"- versions: {meta['versions_text']}",
        f"- generated: {meta['generated']} (total {meta['total_s']:.1f} s)",
        f"- result: **{passed} of {len(outcomes)} experiments passed**",
        "",
        "| # | experiment | result | checks passed | time (s) |",
        "|---|---|---|---|---|",
    ]
    for i, o in enumerate(outcomes, 1):
        checks = o.result.checks if o.result is not None else []
        n_ok = sum(c.passed for c in checks)
        lines.append(
            f"| {i} | {_cell(o.title)} (`{o.name}`) | {_status_word(o)} "
            f"| {n_ok} / {len(checks)} | {o.elapsed_s:.1f} |"
        )
    lines.append("")
    return "\n".join(lines)


def markdown_document(
    outcomes: Sequence[Outcome],
    figures: Mapping[str, Sequence[RenderedFigure]],
    meta: Mapping[str, object],
) -> str:
    """The whole ``report.md``: header, summary table, then each experiment and its figures."""
    parts = [_header(outcomes, meta)]
    for i, o in enumerate(outcomes, 1):
        parts.append(experiment_markdown(i, o))
        for fig in figures.get(o.name, ()):
            parts.append(f"![{o.name}: {fig.stem}]({fig.relpath})\n")
    return "\n".join(parts)


def html_document(
    outcomes: Sequence[Outcome],
    figures: Mapping[str, Sequence[RenderedFigure]],
    meta: Mapping[str, object],
) -> str:
    """The whole ``report.html``: same content as the markdown, figures embedded as base64."""
    body = [to_html(_header(outcomes, meta))]
    for i, o in enumerate(outcomes, 1):
        body.append(f'<section id="{html.escape(o.name)}">')
        body.append(to_html(experiment_markdown(i, o)))
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
        "<title>normlab report</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )
