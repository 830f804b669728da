"""A small Markdown-to-HTML converter for the report's own markdown (no dependency).

It handles exactly what the lab writes: `#` headings, paragraphs, `-` bullet lists,
pipe tables (header row, `---` separator row, body rows; see [normlab.lab.tables][]),
fenced code blocks, the inline marks `code`, **bold**, *italic* and in-page links
`[text](#anchor)`, and three fixed HTML lines the renderer writes itself: an anchor
`<a id="name"></a>`, `<details>` with its `<summary>...</summary>` line, and
`</details>` (a folded block, e.g. a traceback). Everything else is escaped text, so
experiment output can never inject markup into the HTML report.
"""

from __future__ import annotations

import html
import re

from normlab.lab.tables import split_row

__all__ = ["inline", "to_html"]

_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(#([A-Za-z0-9_-]+)\)")
_ANCHOR = re.compile(r'^<a id="([A-Za-z0-9_-]+)"></a>$')
_SUMMARY = re.compile(r"^<summary>(.*)</summary>$")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_ITALIC = re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?![*\w])")
_TABLE_SEP = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def inline(text: str) -> str:
    """Escape `text` and apply the inline marks (code spans are left verbatim)."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 1:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        s = html.escape(part)
        s = _BOLD.sub(r"<strong>\1</strong>", s)
        s = _ITALIC.sub(r"<em>\1</em>", s)
        s = _LINK.sub(r'<a href="#\2">\1</a>', s)
        out.append(s)
    return "".join(out)


def _table(lines: list[str]) -> str:
    head = "".join(f"<th>{inline(c)}</th>" for c in split_row(lines[0]))
    body = []
    for line in lines[2:]:
        cells = "".join(f"<td>{_cell_html(c)}</td>" for c in split_row(line))
        body.append(f"<tr>{cells}</tr>")
    return (  # the wrapper scrolls a wide table by itself; the page never scrolls sideways
        f'<div class="table-wrap"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table></div>"
    )


def _cell_html(cell: str) -> str:
    if cell in ("PASS", "**PASS**"):
        return '<span class="pass">PASS</span>'
    if cell in ("FAIL", "**FAIL**", "ERROR", "**ERROR**"):
        return f'<span class="fail">{cell.strip("*")}</span>'
    if cell in ("NOT REPRODUCED", "**NOT REPRODUCED**"):
        return '<span class="notrep">NOT REPRODUCED</span>'
    if cell in ("INCONCLUSIVE", "**INCONCLUSIVE**"):
        return '<span class="inconc">INCONCLUSIVE</span>'
    return inline(cell)


def to_html(markdown: str) -> str:
    """Convert the lab's markdown to an HTML fragment."""
    lines = markdown.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
        elif _ANCHOR.match(stripped) or stripped in ("<details>", "</details>"):
            out.append(stripped)  # fixed markup written by the renderer (id: [A-Za-z0-9_-])
            i += 1
        elif summary := _SUMMARY.match(stripped):
            out.append(f"<summary>{inline(summary.group(1))}</summary>")
            i += 1
        elif stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1 : j])) + "</pre>")
            i = j + 1
        elif stripped.startswith("#"):
            level = min(len(stripped) - len(stripped.lstrip("#")), 6)
            out.append(f"<h{level}>{inline(stripped[level:].strip())}</h{level}>")
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
        elif stripped.startswith("- "):
            items = []
            while i < len(lines) and lines[i].strip().startswith("- "):
                items.append(f"<li>{inline(lines[i].strip()[2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i]):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{inline(' '.join(para))}</p>")
    return "\n".join(out)


def _starts_block(line: str) -> bool:
    s = line.strip()
    return s.startswith(("```", "#", "|", "- ", "<details>", "</details>", "<summary>", "<a id="))
