"""Markdown pipe tables for the report: built with escaped cells, and read back.

Contract: [markdown_table][normlab.lab.tables.markdown_table] is the one way an experiment
writes a table. Every cell is collapsed to one line and its `|` escaped as `\\|`, so text such
as `||x||` can never split a cell; [parse_tables][normlab.lab.tables.parse_tables] reads every
pipe table of a markdown text back into cells (splitting only on unescaped `|`), which is how
the tests check that each table of each report has one column count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["escape_cell", "markdown_table", "parse_tables", "split_row"]

_PIPE = re.compile(r"(?<!\\)\|")
_SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def escape_cell(text: object) -> str:
    """`text` on one line with every `|` escaped (`"a|b"` -> `"a\\|b"`).

    >>> escape_cell("||x||\\n 2")
    '\\\\|\\\\|x\\\\|\\\\| 2'
    """
    return " ".join(str(text).split()).replace("\\|", "|").replace("|", "\\|")


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A pipe table: header row, `---` separator, one line per row, cells escaped.

    Parameters
    ----------
    header
        The column titles (C of them).
    rows
        Each a sequence of exactly C cells (anything `str()` can format).

    Returns
    -------
    str
        The table's markdown, without a trailing newline.

    Raises
    ------
    ValueError
        a row whose length differs from the header's (names the row).

    Examples
    --------
    >>> print(markdown_table(["l", "||x||"], [[1, 2.5]]))
    | l | \\|\\|x\\|\\| |
    |---|---|
    | 1 | 2.5 |
    """
    width = len(header)
    if width == 0:
        raise ValueError("header must name at least one column; got an empty header")
    lines = ["| " + " | ".join(escape_cell(c) for c in header) + " |", "|---" * width + "|"]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(
                f"rows[{i}] has {len(row)} cells but the header has {width}: {list(row)!r}"
            )
        lines.append("| " + " | ".join(escape_cell(c) for c in row) + " |")
    return "\n".join(lines)


def split_row(line: str) -> list[str]:
    """The cells of one table line, split on unescaped `|` (escapes undone)."""
    row = line.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.strip().replace("\\|", "|") for cell in _PIPE.split(row)]


def parse_tables(markdown: str) -> list[list[list[str]]]:
    """Every pipe table in `markdown` (outside fenced code) as a list of rows of cells.

    A table is a line starting with `|` followed by a `---` separator line; it runs
    while lines start with `|`. The separator row is left out.

    >>> parse_tables("text\\n\\n| a | b |\\n|---|---|\\n| 1 | x\\\\|y |\\n")
    [[['a', 'b'], ['1', 'x|y']]]
    """
    lines = markdown.splitlines()
    tables: list[list[list[str]]] = []
    i, fenced = 0, False
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("```"):
            fenced = not fenced
        elif not fenced and s.startswith("|") and i + 1 < len(lines) and _SEPARATOR.match(
            lines[i + 1]
        ):
            j = i + 2
            rows = [split_row(lines[i])]
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(split_row(lines[j]))
                j += 1
            tables.append(rows)
            i = j
            continue
        i += 1
    return tables
