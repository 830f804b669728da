"""torch.compile with the default (inductor) backend gives eager's bits for every recipe.

For each of the six recipes, a QuantLinear model compiled with `torch.compile(model)` (no
backend argument, no inductor flags) and its eager copy train three steps on the same
inputs: the forward output, dx, dW, db and the layers' recipe state (delayed scales and
amax histories, the last current scales, the stochastic-rounding counter) are compared
bit for bit (tolerance 0: the operand quantisation and the GEMMs run as custom ops that
inductor does not rewrite, so the compiled program executes eager's arithmetic). Each
model also traces with no graph break. The Bf16 recipe's compiled output must differ
from the unrounded product: inductor once removed the float32 -> bfloat16 -> float32
cast pair, returning exactly `x @ W.T + b`.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")

from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
)
from recipe_table import TRAINING, unreduced  # noqa: E402

# torch-side warnings: dynamo instantiates the autograd.Function while tracing, and
# inductor's first compilation touches torch.jit.script_method
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*script_method. is deprecated:DeprecationWarning")]

RECIPES = unreduced(TRAINING)
STATE = ("amax_history", "scale")


def _model(recipe: object) -> torch.nn.Module:
    torch.manual_seed(0)  # parameter init only; the inputs have their own generator
    return torch.nn.Sequential(QuantLinear(64, 48, recipe=recipe), torch.nn.ReLU(),
                               QuantLinear(48, 32, recipe=recipe))


def _x(step: int) -> torch.Tensor:
    # 40 rows: ragged for NVFP4's 16-row Hadamard blocks and MX's 32-row wgrad blocks
    return torch.randn(40, 64, generator=torch.Generator().manual_seed(step)) * 4.0


def _step(model: torch.nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = _x(step).requires_grad_()
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_inductor_equals_eager_bitwise(name: str) -> None:
    dynamo.reset()
    eager = _model(RECIPES[name])
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin)
    for step in range(3):  # later steps use the state the earlier ones left
        for m in (eager, twin):
            m.zero_grad()
        (y_e, dx_e), (y_c, dx_c) = _step(eager, step), _step(compiled, step)
        assert torch.equal(y_e, y_c), f"step {step}: forward"
        assert torch.equal(dx_e, dx_c), f"step {step}: dx"
        for (pname, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), f"step {step}: {pname}.grad"
        for a, b in zip(eager[::2], twin[::2], strict=True):
            for attr in STATE:
                if getattr(a, attr) is not None:
                    assert torch.equal(getattr(a, attr), getattr(b, attr)), attr
            assert a.rounding_step == b.rounding_step
    if name == "nvfp4":
        assert eager[0].rounding_step == 3  # the backward advanced the streams, compiled too


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_traces_without_graph_breaks(name: str) -> None:
    dynamo.reset()
    model = _model(RECIPES[name])
    ex = dynamo.explain(model)(_x(0))
    assert ex.graph_break_count == 0, [str(b.reason)[:200] for b in ex.break_reasons]


def test_inductor_keeps_the_bf16_rounding() -> None:
    dynamo.reset()
    torch.manual_seed(0)
    layer = QuantLinear(64, 48, recipe=Bf16Recipe())
    x = _x(0)
    with torch.no_grad():
        y = torch.compile(layer)(x)
        plain = x @ layer.weight.t() + layer.bias
    assert not torch.equal(y, plain)  # the operands were rounded to bfloat16
    assert torch.equal(y, layer(x))
