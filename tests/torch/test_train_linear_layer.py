"""QuantLinear as a `torch.nn.Linear`: subclass, meta-device initialisation, bad input, the
off switch.

Expected values come from `torch.nn.Linear` itself (same parameters, same input) and from a
layer built directly on the CPU; comparisons are exact (tolerance 0) where the same
operations run on the same bits, and `isfinite` where the point is that a meta-initialised
model trains instead of giving NaN. Torch's own error messages are read at run time from
`torch.nn.Linear`, never written here.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from normlab.torch import (  # noqa: E402
    QuantConv1D,
    QuantLinear,
    convert,
    no_quantization,
    quantization_enabled,
    quantize_current_scaling,
)
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.training._extra_state import unpack_extra_state  # noqa: E402
from recipe_table import TRAINING  # noqa: E402

RECIPES = TRAINING


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(),
                               torch.nn.Linear(48, 8))


def _x(seed: int = 0, rows: int = 16) -> torch.Tensor:
    return torch.randn(rows, 32, generator=torch.Generator().manual_seed(seed))


def test_is_a_linear_with_linears_constructor_and_initialisation() -> None:
    layer = QuantLinear(6, 4, False, recipe=Bf16Recipe(), dtype=torch.float64)
    assert isinstance(layer, torch.nn.Linear)
    assert (layer.in_features, layer.out_features, layer.bias) == (6, 4, None)
    assert layer.weight.dtype == torch.float64
    torch.manual_seed(3)
    ours = QuantLinear(6, 4, recipe=Fp8CurrentRecipe())
    torch.manual_seed(3)
    plain = torch.nn.Linear(6, 4)
    assert torch.equal(ours.weight, plain.weight) and torch.equal(ours.bias, plain.bias)
    with pytest.raises(TypeError, match="recipe"):
        QuantLinear(6, 4, Bf16Recipe())  # recipe is keyword-only


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_meta_init_to_empty_reset_parameters_trains(name: str) -> None:
    # build on meta, convert, materialise, re-initialise: the recipe state is rebuilt and
    # the losses are finite (before the fix the delayed scales were uninitialised memory)
    with torch.device("meta"):
        model = _mlp()
    convert(model, RECIPES[name])
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.reset_parameters()
    fresh = QuantLinear(32, 48, recipe=RECIPES[name])
    for key, want in fresh.state_dict().items():
        if key.endswith("_extra_state"):
            assert torch.equal(model[0].state_dict()[key], want)
    if name == "nvfp4":
        assert torch.equal(model[0].hadamard_matrix, fresh.hadamard_matrix)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(_x(step)).square().mean()
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_to_empty_alone_rebuilds_the_recipe_state() -> None:
    # initialisers that only reset weights (Hugging Face's init_weights) rely on this
    with torch.device("meta"):
        layer = QuantLinear(32, 8, recipe=Fp8DelayedRecipe(amax_history_len=4))
    layer.to_empty(device="cpu")
    assert torch.equal(layer.scale, torch.ones(3))
    assert torch.equal(layer.amax_history, torch.zeros(3, 4))
    layer = QuantLinear(32, 8, recipe=NVFP4Recipe())
    rht = layer.hadamard_matrix.clone()
    with torch.device("meta"):
        meta = QuantLinear(32, 8, recipe=NVFP4Recipe())
    assert torch.equal(meta.to_empty(device="cpu").hadamard_matrix, rht)


def test_casting_the_model_keeps_the_recipe_state_float32_and_unrounded() -> None:
    model = convert(_mlp(), Fp8DelayedRecipe(amax_history_len=4))
    for step in range(3):
        model(_x(step) * 1.01).sum().backward()
    model[0].update_scales()
    scale, history = model[0].scale.clone(), model[0].amax_history.clone()
    assert not torch.equal(scale.to(torch.bfloat16).float(), scale)  # bf16 would round it
    model.to(torch.bfloat16)
    assert model[0].weight.dtype == torch.bfloat16
    assert torch.equal(model[0].scale, scale) and torch.equal(model[0].amax_history, history)


def test_convert_does_not_reinitialise_or_allocate() -> None:
    torch.manual_seed(0)
    model = _mlp()
    weights = [p.detach().clone() for p in model.parameters()]
    before = torch.random.get_rng_state()
    convert(model, Fp8CurrentRecipe())
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights, strict=True))
    with torch.device("meta"):
        meta = _mlp()
    convert(meta, NVFP4Recipe())
    assert all(p.is_meta for p in meta.parameters()) and meta[0].hadamard_matrix.is_meta


def _hf_conv1d(k: int, n: int) -> torch.nn.Module:
    return pytest.importorskip("transformers.pytorch_utils").Conv1D(n, k)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize(("cls", "plain_cls"), [(QuantLinear, torch.nn.Linear),
                                                (QuantConv1D, _hf_conv1d)])
def test_integer_and_bool_input_raise_like_linear(dtype: torch.dtype, cls: type,
                                                  plain_cls) -> None:
    x = torch.ones(3, 4, dtype=dtype)
    with pytest.raises(Exception) as plain:
        plain_cls(4, 2)(x)
    with pytest.raises(type(plain.value)) as ours:
        cls(4, 2, recipe=Fp8CurrentRecipe())(x)
    assert str(ours.value) == str(plain.value)


@pytest.mark.parametrize("shape", [(0, 32), (2, 0, 32)])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_empty_batch_forward_and_backward(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = convert(_mlp(), RECIPES[name])
    before = [m.get_extra_state().clone() for m in model if isinstance(m, QuantLinear)]
    x = torch.zeros(shape, requires_grad=True)
    y = model(x)
    assert y.shape == (*shape[:-1], 8)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for p in model.parameters():
        assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p))
    after = [m.get_extra_state() for m in model if isinstance(m, QuantLinear)]
    # a training forward of no rows takes part in the step as a full batch would: x and
    # dy have amax 0 (nothing recorded; current scaling: scale 1, the fallback), W has
    # its own (delayed: recorded in slot 0; current: its scale)
    for old, new, layer in zip(before, after, _quant_layers(model), strict=True):
        old, new = unpack_extra_state(old), unpack_extra_state(new)
        if "amax_history" in old:
            want_history = old["amax_history"].clone()
            want_history[1, 0] = layer.weight.detach().abs().max()
            assert torch.equal(new["amax_history"], want_history)
        if "scale" in old and name == "current":
            want = quantize_current_scaling(layer.weight.detach(), "e4m3").scale
            assert new["scale"].tolist() == [1.0, float(want), 1.0]
        elif "scale" in old and name == "rowwise_gw_hp":  # only W's dgrad scale (per tensor)
            want = quantize_current_scaling(layer.weight.detach(), "e4m3", amax_epsilon=1e-12,
                                            power_of_2_scales=True).scale
            assert new["scale"].tolist() == [1.0, float(want), 1.0]
        elif "scale" in old:
            assert torch.equal(old["scale"], new["scale"])
    model.eval()
    with torch.no_grad():  # an evaluation of no rows touches nothing
        model(torch.zeros(shape))
    assert all(torch.equal(m.get_extra_state(), a)
               for m, a in zip(_quant_layers(model), after, strict=True))


def _quant_layers(model: torch.nn.Module) -> list[QuantLinear]:
    return [m for m in model if isinstance(m, QuantLinear)]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_no_quantization_is_linear_and_records_nothing(name: str) -> None:
    torch.manual_seed(0)
    plain = _mlp()
    model = convert(copy.deepcopy(plain), RECIPES[name])
    model(_x(1)).sum().backward()  # some recipe state to keep
    state = [m.get_extra_state().clone() for m in model if isinstance(m, QuantLinear)]
    x = _x(2).requires_grad_(True)
    xp = x.detach().clone().requires_grad_(True)
    assert quantization_enabled()
    with no_quantization():
        assert not quantization_enabled()
        model.zero_grad()
        y = model(x)
        y.square().sum().backward()
        y2 = model(x)  # a second training forward: no scale update either
    assert quantization_enabled()
    yp = plain(xp)
    yp.square().sum().backward()
    assert torch.equal(y, yp) and torch.equal(y2, yp) and torch.equal(x.grad, xp.grad)
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    after = [m.get_extra_state() for m in model if isinstance(m, QuantLinear)]
    assert all(torch.equal(a, b) for a, b in zip(state, after, strict=True))
    assert not torch.equal(model(_x(2)), plain(_x(2)))  # quantised again outside


def test_no_quantization_nests_restores_on_error_and_decorates() -> None:
    with no_quantization():
        with no_quantization():
            pass
        assert not quantization_enabled()
    assert quantization_enabled()
    with pytest.raises(RuntimeError, match="boom"), no_quantization():
        raise RuntimeError("boom")
    assert quantization_enabled()

    @no_quantization()
    def evaluate() -> bool:
        return quantization_enabled()

    assert evaluate() is False and quantization_enabled()


def test_conv1d_layer_is_quantlinear_on_the_transposed_weight(rng) -> None:
    conv = QuantConv1D(32, 24, recipe=MXRecipe())
    lin = QuantLinear(32, 24, recipe=MXRecipe())
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        lin.bias.copy_(conv.bias)
    assert conv.weight.shape == (32, 24) and (conv.nx, conv.nf) == (32, 24)
    x = torch.from_numpy(rng.standard_normal((8, 32)).astype("float32"))
    a, b = conv(x), lin(x)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # float32 summation order only
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(conv.weight.grad, lin.weight.grad.t(), rtol=1e-6, atol=1e-6)
