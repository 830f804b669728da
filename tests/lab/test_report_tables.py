"""Every table of every experiment's report parses to one column count, in markdown and HTML.

The results come from the session's quick runs (``quick_results``); each is rendered the
way the report renders it (status line, checks table, its own tables, DETECTS) and every
pipe table is read back, splitting on unescaped ``|`` only. A cell text such as ``||x||``
that was not escaped would show up here as a row with too many cells.
"""

from __future__ import annotations

import re

import pytest

from normlab.lab._markdown import to_html
from normlab.lab.experiments import EXPERIMENTS
from normlab.lab.render import experiment_markdown
from normlab.lab.runner import Outcome
from normlab.lab.tables import markdown_table, parse_tables


def _rendered(name: str, quick_results) -> str:
    result = quick_results[name]
    outcome = Outcome(name, result.title, "pass", 0.0, result=result, detects=("a | b",))
    return experiment_markdown(1, outcome, "quick")


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_table_has_one_column_count(name, quick_results):
    md = _rendered(name, quick_results)
    tables = parse_tables(md)
    assert len(tables) >= 1 + len(quick_results[name].tables)  # checks + the experiment's own
    for table in tables:
        widths = {len(row) for row in table}
        assert widths == {len(table[0])}, (name, table[0], widths)
    html = to_html(md)
    for block in re.findall(r"<table>.*?</table>", html, flags=re.S):
        counts = {len(re.findall(r"<t[hd]>", row)) for row in re.findall(r"<tr>.*?</tr>", block)}
        assert len(counts) == 1, (name, counts)
    assert "`normlab run " + name + " --quick`" in md


def test_markdown_table_escapes_pipes_and_rejects_ragged_rows():
    table = markdown_table(["l", "||x||²/d"], [[1, "a|b"], [2, "c\\|d"]])
    assert parse_tables(table) == [[["l", "||x||²/d"], ["1", "a|b"], ["2", "c|d"]]]
    with pytest.raises(ValueError, match=r"rows\[0\] has 1 cells but the header has 2"):
        markdown_table(["a", "b"], [[1]])


def test_parse_tables_skips_fenced_code():
    md = "```\n| a | b |\n|---|---|\n```\n\n| x |\n|---|\n| 1 |\n"
    assert parse_tables(md) == [[["x"], ["1"]]]
