"""Converted layers under `torch.autocast`: operands from the autocast dtype, its output.

Under `torch.autocast("cpu", dtype=torch.bfloat16)`, `torch.nn.Linear` casts its input,
weight and bias to bfloat16 and returns bfloat16. A converted layer must do the same with
its recipe, so the reference is a twin layer with the same recipe whose parameters were
cast to bfloat16 beforehand, called on the bfloat16 input outside autocast: the same
operands in the same dtype. Forward output, input gradient and the parameter gradients
(cast back to float32, as autograd casts those of the float32 parameters) must be equal
bit for bit (tolerance 0: the same operations on the same bits), for every recipe of the
differential suite and FP8 delayed scaling, eagerly and, for one recipe of each family,
under `torch.compile` (inductor: the roundings and GEMMs are opaque custom ops; the
gradients compared after rounding to bfloat16, see `_check`). The output dtype is read
from `torch.nn.functional.linear` under the same autocast.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import recipe_differential as diff  # noqa: E402

from normlab.torch import QuantConv1D, QuantLinear  # noqa: E402
from normlab.torch.recipes import Fp8DelayedRecipe  # noqa: E402

RECIPES = {**diff.RECIPES, "delayed": Fp8DelayedRecipe(amax_history_len=4, reduce_amax=False)}
COMPILED = ["bf16", "current", "delayed", "mx_e4m3_e5m2", "nvfp4", "blockwise", "rowwise"]


def _pair(name: str, cls: type = QuantLinear) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    layer = cls(72, 56, recipe=RECIPES[name])
    return layer, copy.deepcopy(layer).to(torch.bfloat16)  # the twin: bfloat16 parameters


def _x() -> torch.Tensor:
    return torch.randn(40, 72, generator=torch.Generator().manual_seed(1)) * 3.0


def _run(layer: torch.nn.Module, x: torch.Tensor, autocast: bool) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.dtype)
    y.backward(dy)
    return [y, x.grad, layer.weight.grad, layer.bias.grad]


def _check(name: str, layer: torch.nn.Module, twin: torch.nn.Module,
           call: torch.nn.Module | None = None) -> None:
    # compiled: inductor skips a bfloat16 -> float32 round trip of its own graph (its
    # emulate_precision_casts is off), so the gradients autograd casts back to float32 may
    # keep bits the eager cast drops; rounded to bfloat16 they are eager's
    got = _run(layer if call is None else call, _x(), autocast=True)
    want = _run(twin, _x().to(torch.bfloat16), autocast=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.nn.functional.linear(_x(), torch.ones(56, 72), torch.ones(56))
    assert got[0].dtype == plain.dtype == torch.bfloat16, name
    assert got[1].dtype == torch.float32  # the input's gradient in the input's dtype
    assert layer.weight.grad.dtype == torch.float32  # the parameters' own dtype
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if call is None:
            assert torch.equal(g, w.to(g.dtype)), (name, i)
        else:
            assert torch.equal(g.to(torch.bfloat16), w), (name, i)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_autocast_quantises_the_autocast_operands(name: str) -> None:
    _check(name, *_pair(name))


def test_autocast_conv1d() -> None:
    _check("current", *_pair("current", QuantConv1D))


def test_without_autocast_the_float32_path_is_unchanged() -> None:
    # control (and the planted-fault check of the comparison): float32 operands are not
    # the bfloat16 ones, so the twin's result differs
    layer, twin = _pair("current")
    got = _run(layer, _x(), autocast=False)
    want = _run(twin, _x().to(torch.bfloat16), autocast=False)
    assert got[0].dtype == torch.float32
    assert not torch.equal(got[0], want[0].to(torch.float32))


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*script_method. is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", COMPILED)
def test_autocast_compiled_equals_eager(name: str) -> None:
    import torch._dynamo as dynamo

    dynamo.reset()
    layer, twin = _pair(name)
    _check(name, layer, twin, call=torch.compile(layer))
