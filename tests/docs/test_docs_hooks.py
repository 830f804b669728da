"""The documentation build's docstring preprocessing (docs/_hooks/griffe_house_style.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "griffe_house_style", ROOT / "docs" / "_hooks" / "griffe_house_style.py"
)
assert _spec is not None and _spec.loader is not None
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)


def test_example_sections_become_examples():
    text = "Sum.\n\nExample\n-------\n>>> f(1)\n2\n"
    assert house.house_style(text) == "Sum.\n\nExamples\n--------\n>>> f(1)\n2\n"


def test_math_like_prose_is_not_a_link_but_links_and_code_stay():
    text = (
        "    layers in turn (x_i = blocks[i-1](x_{i-1})), see [paper](https://arxiv.org/x),\n"
        "the [guide](../howto/a.md) and `a[0](x)`\n"
        ">>> f[0](1)\n"
    )
    assert house.house_style(text) == (
        "    layers in turn (x_i = blocks[i-1]\\(x_{i-1})), see [paper](https://arxiv.org/x),\n"
        "the [guide](../howto/a.md) and `a[0](x)`\n"
        ">>> f[0](1)\n"
    )
