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


SOURCE = '''
class Base:
    def forward(self, x):
        """Compute the output."""


class Layer(Base):
    """A layer.

    Parameters
    ----------
    eps : float
        Added to the variance.

    Attributes
    ----------
    weight, bias : array
        The gain and the bias.
    missing : int
        Not an attribute of the class: stays in the section.
    """

    eps: float
    weight: object
    bias: object
    documented: int
    """Its own text."""

    def forward(self, x):
        return x
'''


def _layer(tmp_path):
    import griffe

    (tmp_path / "house_style_sample.py").write_text(SOURCE, encoding="utf-8")
    loader = griffe.GriffeLoader(search_paths=[tmp_path], docstring_parser="numpy")
    return loader.load("house_style_sample")["Layer"]


def test_attributes_entries_become_the_fields_docstrings(tmp_path):
    layer = _layer(tmp_path)
    assert layer.members["weight"].docstring is None
    moved = house.attributes_to_members(layer)
    assert moved == ["weight", "bias"]
    assert layer.members["bias"].docstring.value == "The gain and the bias."
    assert layer.members["documented"].docstring.value == "Its own text."  # kept
    (section,) = [s for s in layer.docstring.parsed if s.kind.value == "attributes"]
    assert [a.name for a in section.value] == ["missing"]  # the page does not say it twice


def test_a_field_that_stores_a_parameter_gets_its_text(tmp_path):
    layer = _layer(tmp_path)
    assert house.parameters_to_fields(layer) == ["eps"]
    assert layer.members["eps"].docstring.value == "Added to the variance."


def test_an_override_without_a_docstring_shows_the_base_one(tmp_path):
    layer = _layer(tmp_path)
    assert house.inherit_method_docstrings(layer) == ["forward"]
    assert layer.members["forward"].docstring.value == "Compute the output."


EXPERIMENT = '''"""An experiment."""

NAME = "sample"
TITLE = "A sample"
"""Its own title text."""
OTHER = 1
'''


def test_an_experiments_contract_constants_get_the_contracts_text(tmp_path):
    import griffe

    from normlab.lab.result import CONTRACT

    (tmp_path / "contract_sample.py").write_text(EXPERIMENT, encoding="utf-8")
    loader = griffe.GriffeLoader(search_paths=[tmp_path], docstring_parser="numpy")
    module = loader.load("contract_sample")
    assert house.contract_docstrings(module, CONTRACT, module) == ["NAME"]
    assert module.members["NAME"].docstring.value == CONTRACT["NAME"]
    assert module.members["TITLE"].docstring.value == "Its own title text."  # kept
    assert module.members["OTHER"].docstring is None  # not in the contract


def test_every_experiment_declares_the_contract():
    from normlab.lab.experiments import EXPERIMENTS
    from normlab.lab.result import CONTRACT

    for name in EXPERIMENTS:
        module = importlib.import_module(f"normlab.lab.experiments.{name}")
        missing = [c for c in CONTRACT if not hasattr(module, c)]
        assert not missing, f"{name} lacks {missing}"
