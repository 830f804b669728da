"""QuantLinear and convert: the three GEMMs against NumPy references, state, conversion.

References are built from normlab's NumPy recipes (``quantize``, ``mx_quantize``,
``Fp8Meta``) and NumPy float32 matmuls. Values that only depend on rounding are compared
exactly; GEMM results with rtol 1e-5 / atol 1e-6 because NumPy's and PyTorch's float32
matmuls may sum the K products in different orders (a few float32 ulps on sums of <= 96
terms of size ~1).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import (  # noqa: E402
    DelayedScaling,
    Fp8Meta,
    compute_scale,
    mx_dequantize,
    mx_quantize,
    quantize,
)
from normlab.torch import QuantLinear, convert  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.training._extra_state import unpack_extra_state  # noqa: E402

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _layer(recipe, rng, k=64, n=32):
    layer = QuantLinear(k, n, recipe=recipe)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(rng.standard_normal(n).astype(np.float32)))
    return layer


def _grads(layer, x, dy):
    xt = torch.from_numpy(x).requires_grad_(True)
    y = layer(xt)
    y.backward(torch.from_numpy(dy))
    return y.detach().numpy(), xt.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()


def test_bf16_gemms_equal_numpy(rng) -> None:
    x = rng.standard_normal((48, 64)).astype(np.float32)
    dy = rng.standard_normal((48, 32)).astype(np.float32)
    layer = _layer(Bf16Recipe(), rng)
    w, b = layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()
    y, dx, dw, db = _grads(layer, x, dy)
    qx, qw, qdy = quantize(x, "bf16"), quantize(w, "bf16"), quantize(dy, "bf16")
    np.testing.assert_allclose(y, qx @ qw.T + b, **TOL)
    np.testing.assert_allclose(dx, qdy @ qw, **TOL)
    np.testing.assert_allclose(dw, qdy.T @ qx, **TOL)
    np.testing.assert_allclose(db, dy.sum(0), **TOL)  # the bias gradient is not quantised


def test_mx_blocks_run_along_each_contraction(rng) -> None:
    # forward blocks along K, dgrad along N (dy rows, W columns), wgrad along M
    x = rng.standard_normal((64, 64)).astype(np.float32) * np.float32(4.0)
    dy = rng.standard_normal((64, 32)).astype(np.float32) * np.float32(1e-3)
    layer = _layer(MXRecipe("e4m3", grad_elem="e5m2"), rng)
    w = layer.weight.detach().numpy().copy()
    y, dx, dw, _ = _grads(layer, x, dy)

    def mx(a, fmt, axis):
        return mx_dequantize(mx_quantize(a, fmt, block_size=32, axis=axis))

    np.testing.assert_allclose(y - layer.bias.detach().numpy(),
                               mx(x, "e4m3", 1) @ mx(w, "e4m3", 1).T, **TOL)
    np.testing.assert_allclose(dx, mx(dy, "e5m2", 1) @ mx(w, "e4m3", 0), **TOL)
    np.testing.assert_allclose(dw, mx(dy, "e5m2", 0).T @ mx(x, "e4m3", 0), **TOL)
    # blocking along the wrong axis gives a measurably different product
    assert np.abs(dw - mx(dy, "e5m2", 1).T @ mx(x, "e4m3", 1)).max() > 1e-4


@pytest.mark.parametrize("recipe", [NVFP4Recipe(), BlockwiseFp8Recipe(block_size=16)])
def test_2d_weight_blocks_quantise_w_and_wt_alike(recipe, rng) -> None:
    w = torch.from_numpy(rng.standard_normal((48, 40)).astype(np.float32))
    layer = QuantLinear(40, 48, recipe=recipe)
    from normlab.torch.training._gemm import quantize_operand

    fwd = quantize_operand(layer, w, "w", axis=1)
    bwd = quantize_operand(layer, w, "w", axis=0)
    assert torch.equal(fwd, bwd)
    if isinstance(recipe, NVFP4Recipe):  # 1x16 blocks differ between the two GEMMs
        one_d = QuantLinear(40, 48, recipe=NVFP4Recipe(two_d_weights=False))
        assert not torch.equal(quantize_operand(one_d, w, "w", axis=1),
                               quantize_operand(one_d, w, "w", axis=0))


def test_nvfp4_stochastic_gradients_follow_the_seed(rng) -> None:
    x = rng.standard_normal((32, 64)).astype(np.float32)
    dy = rng.standard_normal((32, 32)).astype(np.float32)
    runs = []
    for recipe in (NVFP4Recipe(seed=1), NVFP4Recipe(seed=1), NVFP4Recipe(seed=2)):
        runs.append(_grads(_layer(recipe, np.random.default_rng(0)), x, dy)[2])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_delayed_scaling_state_follows_fp8meta(rng) -> None:
    recipe = Fp8DelayedRecipe(amax_history_len=3, margin=1)
    layer = _layer(recipe, rng)
    metas = [Fp8Meta(DelayedScaling(1, 3, "max"), role) for role in
             ("forward", "forward", "backward")]
    for step in range(4):
        x = (rng.standard_normal((16, 64)) * 2.0**step).astype(np.float32)
        dy = (rng.standard_normal((16, 32)) * 1e-3).astype(np.float32)
        w = layer.weight.detach().numpy().copy()
        _grads(layer, x, dy)  # forward updates the scales of the previous step first
        for meta, t in zip(metas, (x, w, dy), strict=True):
            meta.quantize(t)
        layer.weight.grad = None
        layer.update_scales()
        for meta in metas:
            meta.update()
        assert layer.scale.tolist() == [m.scale for m in metas]
        np.testing.assert_array_equal(layer.amax_history.numpy(),
                                      np.stack([m.amax_history for m in metas]))


def test_state_dict_round_trip(rng) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    convert(model, Fp8DelayedRecipe(amax_history_len=4))
    for _ in range(3):
        model(torch.randn(8, 64)).sum().backward()
    state = model.state_dict()
    fresh = convert(torch.nn.Sequential(torch.nn.Linear(64, 32)),
                    Fp8DelayedRecipe(amax_history_len=4))
    fresh.load_state_dict(state)
    assert torch.equal(fresh[0].amax_history, model[0].amax_history)
    assert torch.equal(fresh[0].scale, model[0].scale) and fresh[0].pending
    x = torch.randn(8, 64)
    assert torch.equal(fresh(x), model(x))
    bad = {**state, "0._extra_state": {**unpack_extra_state(state["0._extra_state"]),
                                       "scale": torch.ones(2)}}
    with pytest.raises(ValueError, match="scale"):
        fresh.load_state_dict(bad)


def test_convert_keeps_parameters_and_skips(rng) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    w0, head = net[0].weight, net[2]
    before = torch.random.get_rng_state()
    convert(net, Fp8CurrentRecipe(), module_filter_fn=lambda m, name: name != "2")
    assert torch.equal(torch.random.get_rng_state(), before)  # no draws from the user's RNG
    assert isinstance(net[0], QuantLinear) and net[0].weight is w0 and net[2] is head


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="recipe must be one of"):
        QuantLinear(4, 4, recipe="fp8")
    with pytest.raises(ValueError, match="in_features"):
        QuantLinear(0, 4, recipe=Bf16Recipe())
    with pytest.raises(ValueError, match="in_features=4"):
        QuantLinear(4, 2, recipe=Bf16Recipe())(torch.ones(3, 5))
    with pytest.raises(TypeError, match=r"itself a Linear"):
        convert(torch.nn.Linear(2, 2), Bf16Recipe())
    with pytest.raises(ValueError, match="fp8_format"):
        Fp8DelayedRecipe(fp8_format="E3M4")
    with pytest.raises(TypeError, match="hadamard"):
        NVFP4Recipe(hadamard=1)


def test_current_scaling_records_the_scales_it_used(rng) -> None:
    layer = _layer(Fp8CurrentRecipe(), rng)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    _grads(layer, x, rng.standard_normal((16, 32)).astype(np.float32))
    want = compute_scale(float(np.abs(x).max()), 448.0)
    assert float(layer.scale[0]) == want
