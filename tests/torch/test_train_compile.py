"""torch.compile of QuantLinear: one graph (no breaks) for the per-tensor and MX recipes, and
an aot_eager forward + backward equal to eager bit for bit (tolerance 0: the compiled graph
runs the same float32 ops in the same order)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")

from normlab.torch import QuantLinear  # noqa: E402
from recipe_table import TRAINING, unreduced  # noqa: E402

# Dynamo instantiates the autograd.Function internally while tracing (a torch-side warning)
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*should not be instantiated:DeprecationWarning")

RECIPES = unreduced(TRAINING)


def _model(recipe: object) -> torch.nn.Module:
    torch.manual_seed(0)  # parameter init only; the inputs below have their own generator
    return torch.nn.Sequential(QuantLinear(64, 32, recipe=recipe), torch.nn.ReLU(),
                               QuantLinear(32, 16, recipe=recipe))


def _x(seed: int) -> torch.Tensor:
    return torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_forward_traces_as_one_graph(name: str) -> None:
    dynamo.reset()
    ex = dynamo.explain(_model(RECIPES[name]))(_x(0))
    assert ex.graph_break_count == 0, [str(b.reason)[:200] for b in ex.break_reasons]
    assert ex.graph_count == 1


def test_aot_eager_matches_eager_bitwise_with_delayed_state() -> None:
    dynamo.reset()
    eager = _model(RECIPES["delayed"])
    base = copy.deepcopy(eager)
    compiled = torch.compile(base, backend="aot_eager")
    for step in range(2):  # the second step uses the scale updated from the first
        for m in (eager, compiled):
            m(_x(step) * 8.0).square().sum().backward()
    for a, b in zip(eager.parameters(), base.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    for a, b in zip(eager[::2], base[::2], strict=True):
        assert torch.equal(a.scale, b.scale) and torch.equal(a.amax_history, b.amax_history)


def test_no_quantization_switches_a_compiled_model_too() -> None:
    # the switch is a module global that dynamo guards: toggling it recompiles, never reuses
    # the quantised graph
    from normlab.torch import no_quantization

    dynamo.reset()
    model = _model(RECIPES["current"])
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16))
    plain.load_state_dict(model.state_dict(), strict=False)
    compiled = torch.compile(model, backend="aot_eager")
    quantised = compiled(_x(0))
    with no_quantization():
        assert torch.equal(compiled(_x(0)), plain(_x(0)))
    assert torch.equal(compiled(_x(0)), quantised)
    assert not torch.equal(quantised, plain(_x(0)))
