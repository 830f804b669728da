"""Read a built site the way a reader does and list what reads wrong, page by page.

Used by ``test_docs_render.py`` (and runnable on any built site:
``python tests/docs/site_audit.py SITE_DIR`` prints the counts per page). What it finds:

* raw reST: a role (``:func:`x```, ``:class:``...), a directive (``.. math::``) or a
  ``double-backtick`` literal that reached the page as text. Code blocks (``<pre>``) are
  not read; inline code is, because griffe puts a misparsed parameter's prose into the
  Type column as code;
* empty descriptions: a row of a Parameters / Returns / Raises / Attributes table whose
  Description cell is empty (the docstring's prose landed in the Type column, or there was
  none);
* bare names: an API entry (function, class, attribute) shown without any text.

Pages wider than a phone and lab pages without a verdict are checked by the test itself (the
first needs a browser, the second the committed report).
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["bare_names", "empty_descriptions", "raw_rest", "reader_text"]

_SKIP = {"pre", "script", "style", "math", "svg", "title"}
CODE_START, CODE_END = "\x02", "\x03"  # inline code in reader_text: \x02 text \x03


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skipping += 1
        elif tag == "code" and not self.skipping:
            self.parts.append(CODE_START)
        elif tag in {"p", "div", "li", "td", "th", "br", "tr", "h1", "h2", "h3", "h4"}:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag == "code" and not self.skipping:
            self.parts.append(CODE_END)

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def reader_text(page_html: str) -> str:
    """What a reader sees of a page, without code blocks; inline code between \\x02 and \\x03."""
    parser = _Text()
    parser.feed(page_html)
    return "".join(parser.parts)


_ROLE = re.compile(r"(?<![\w:]):(?:[a-z]+:)?[a-z]+:(?=[`\x02])")
_DIRECTIVE = re.compile(r"(?<!\.)\.\. [a-z][a-z-]*::")
_DOUBLE_BACKTICK = re.compile(r"(?<!`)``[^`\n]+``(?!`)")
_SEGMENT = re.compile(f"{CODE_START}[^{CODE_END}]*{CODE_END}|[^{CODE_START}]+")


def _context(text: str, start: int, end: int) -> str:
    context = text[max(0, start - 30) : end + 30].replace(CODE_START, "`")
    return context.replace(CODE_END, "`").replace("\n", " ").strip()


def raw_rest(page_html: str) -> list[str]:
    """Every raw reST role, directive and double-backtick literal a reader sees, in order.

    A double-backtick literal counts within one stretch of text or one inline code element
    (griffe shows a misparsed type as code), never across them: inline code may itself hold
    backticks (`` ```python ``).
    """
    text = reader_text(page_html)
    found = [_context(text, m.start(), m.end()) for m in _ROLE.finditer(text)]
    found += [_context(text, m.start(), m.end()) for m in _DIRECTIVE.finditer(text)]
    for segment in _SEGMENT.finditer(text):
        for m in _DOUBLE_BACKTICK.finditer(segment.group(0)):
            found.append(_context(text, segment.start() + m.start(), segment.start() + m.end()))
    return found


_ROW = re.compile(r'<tr class="doc-section-item">(.*?)</tr>', re.S)
_EMPTY_DESCRIPTION = re.compile(r'<div class="doc-md-description">\s*</div>')
_CELL_TEXT = re.compile(r"<td[^>]*>(.*?)</td>", re.S)


def _plain(fragment: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", fragment).split())


def empty_descriptions(page_html: str) -> list[str]:
    """The rows of the docstring tables whose Description is empty (their first cells)."""
    found = []
    for row in _ROW.finditer(page_html):
        if _EMPTY_DESCRIPTION.search(row.group(1)):
            cells = [_plain(c) for c in _CELL_TEXT.findall(row.group(1))]
            found.append(" | ".join(c for c in cells[:2] if c))
    return found


_OBJECT = re.compile(  # a heading, its signature, then empty contents (never across headings)
    r'<h\d id="([^"]+)" class="doc doc-heading">(?:(?!<h\d).)*?</h\d>\s*'
    r'(?:<div class="doc-signature highlight">(?:(?!<h\d).)*?</div>\s*)?'
    r'<div class="doc doc-contents[^"]*">\s*</div>',
    re.S,
)



def bare_names(page_html: str) -> list[str]:
    """API entries shown with a heading (and signature) but no text at all."""
    return [m.group(1) for m in _OBJECT.finditer(page_html)]


def _main(site: Path) -> int:
    total = {"raw reST": 0, "empty descriptions": 0, "bare names": 0}
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        counts = {
            "raw reST": len(raw_rest(text)),
            "empty descriptions": len(empty_descriptions(text)),
            "bare names": len(bare_names(text)),
        }
        for key, value in counts.items():
            total[key] += value
        if any(counts.values()):
            print(f"{page.relative_to(site)}: {counts}")
    print(f"total: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(Path(sys.argv[1])))
