"""Non-finite operands: what each recipe gives for an inf activation, and the per-layer count.

What a recipe returns for an inf in x follows from its scale rule, stated here
independently of the code: a per-tensor or per-block scale computed from an inf amax falls
back (FP8 current and delayed scaling: scale 1; blockwise FP8 and NVFP4: the block's scale
from the amax), and the saturating cast clips inf to the format's largest value, so the
output row stays finite (Transformer Engine's behaviour); MX's shared exponent of an inf
block is the NaN code (the block becomes NaN), FP8 rowwise's scale of an inf row is
448 / inf = 0 (torchao: the row dequantises to NaN) and Bf16 keeps the inf, so the row is
non-finite, as in `torch.nn.Linear`. A NaN stays NaN in every recipe. The count
`nonfinite_operands` (x, W, dy) must see all of them, and restart at each step.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import recipe_differential as diff  # noqa: E402

from normlab.torch import QuantLinear, nonfinite_layers, training_step  # noqa: E402
from normlab.torch.recipes import Fp8DelayedRecipe, Fp8RowwiseRecipe, MXRecipe  # noqa: E402

RECIPES = {**diff.RECIPES, "delayed": Fp8DelayedRecipe(amax_history_len=4, reduce_amax=False)}
# the rows an inf in x leaves non-finite: MX (NaN block) and the 16-bit rounding (inf kept)
NONFINITE_ROW = {name for name, r in RECIPES.items()
                 if isinstance(r, (MXRecipe, Fp8RowwiseRecipe))} | {"bf16", "fp16"}


def _model(name: str) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(QuantLinear(64, 32, recipe=RECIPES[name]))


def _x(bad: float | None = None) -> torch.Tensor:
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    if bad is not None:
        x[3, 5] = bad
    return x


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_an_inf_activation_is_counted_whatever_the_output(name: str) -> None:
    model = _model(name)
    y = model(_x(float("inf")))
    finite_rows = torch.isfinite(y).all(dim=1)
    assert finite_rows[[0, 1, 2, 4, 5, 6, 7]].all()
    assert bool(finite_rows[3]) == (name not in NONFINITE_ROW), name
    assert nonfinite_layers(model) == {"0": 1}  # x; W and (not yet) dy are finite
    model(_x()).sum().backward()  # the next step: the count restarts
    assert nonfinite_layers(model) == {}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_nan_activation_and_a_nan_gradient_are_counted(name: str) -> None:
    model = _model(name)
    y = model(_x(float("nan")))
    assert torch.isnan(y[3]).any() and torch.isfinite(y[[0, 1, 2, 4, 5, 6, 7]]).all()
    dy = torch.ones_like(y)
    dy[0, 0] = float("nan")
    y.backward(dy)
    assert int(model[0].nonfinite_operands) == 2  # x in the forward, dy in the backward


def test_the_count_covers_the_whole_step_and_evaluation_does_not_restart_it() -> None:
    model = _model("delayed")
    with training_step(model):
        model(_x(float("inf"))).sum().backward()
        model(_x()).sum().backward()  # a second micro-batch of the same step
        assert nonfinite_layers(model) == {"0": 1}
    model.eval()
    with torch.no_grad():
        model(_x(float("-inf")))  # an evaluation adds, never restarts
    assert nonfinite_layers(model) == {"0": 2}
    model.train()
    model(_x()).sum().backward()
    assert nonfinite_layers(model) == {}


def test_nonfinite_layers_checks_its_argument() -> None:
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        nonfinite_layers("model")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["current", "delayed", "mx_e4m3_e5m2", "nvfp4"])
def test_a_recomputed_forward_is_not_counted_again(name: str) -> None:
    from torch.utils.checkpoint import checkpoint

    model = _model(name)
    x = _x(float("inf")).requires_grad_()
    checkpoint(model, x, use_reentrant=False).sum().backward()  # x's forward runs twice
    assert int(model[0].nonfinite_operands) == 1
