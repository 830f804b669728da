"""A griffe extension for the house docstrings, so they render as written.

* ``Example`` sections read as numpydoc's ``Examples``: without this griffe leaves such a
  section in the description, where markdown turns the dashes into a heading and reads code
  such as ``rows[0]["key"]`` as a link; with it, ``>>>`` lines become highlighted code.
* Math-like prose such as ``blocks[i-1](x_{i-1})`` is not a markdown link: outside code
  (backtick spans, ``>>>`` lines, fenced blocks) ``](`` is escaped unless a URL
  or a path follows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^([ \t]*)Example\n([ \t]*)-{7,}[ \t]*$", re.M)
_NOT_A_LINK = re.compile(r"\]\((?!https?://|\.{0,2}/|#|[\w.-]+\.(?:md|html|png)\b)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _escape_pseudo_links(text: str) -> str:
    out, fenced = [], False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        if fenced or stripped.startswith((">>>", "...")):
            out.append(line)
            continue
        pieces, last = [], 0
        for span in _CODE_SPAN.finditer(line):
            pieces.append(_NOT_A_LINK.sub(r"]\\(", line[last : span.start()]))
            pieces.append(span.group(0))
            last = span.end()
        pieces.append(_NOT_A_LINK.sub(r"]\\(", line[last:]))
        out.append("".join(pieces))
    return "\n".join(out)


def house_style(text: str) -> str:
    """The docstring ``text`` as the numpy parser and markdown should see it."""
    return _escape_pseudo_links(_EXAMPLE.sub(r"\1Examples\n\2--------", text))


class HouseStyleDocstrings(griffe.Extension):
    """Apply :func:`house_style` to every docstring before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = house_style(obj.docstring.value)
