"""A griffe extension for the house docstrings: ``Example`` sections read as ``Examples``.

numpydoc names the section ``Examples``; many normlab docstrings say ``Example``. Without
this, griffe leaves such a section in the description, where markdown turns the dashes
into a heading and reads code such as ``rows[0]["key"]`` as a link. With it, the section
is parsed as examples: ``>>>`` lines become highlighted code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^([ \t]*)Example\n([ \t]*)-{7,}[ \t]*$", re.M)


class HouseStyleDocstrings(griffe.Extension):
    """Rename singular ``Example`` sections before the numpy parser sees them."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and "Example\n" in obj.docstring.value:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples\n\2--------", obj.docstring.value)
