"""The bfloat16 GEMM of bfloat16 models (`torch/training/_bf16_gemm`) against the exact path.

Tolerances (derived in the module header): torch's CPU bfloat16 GEMM accumulates in
float32 and rounds once, so against the float32 GEMM of the same values an output differs
by at most u |y| (u = 2^-8, the output rounding after the per-tensor factor) plus float32
accumulation in another order, 2 (K + 2) eps32 (|a| |b|). Cast to bfloat16, both outputs
are then at most one bfloat16 unit apart, plus that accumulation term.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import normlab.torch as nt  # noqa: E402
from normlab.precision.formats.format import BFLOAT16  # noqa: E402
from normlab.torch.training import _bf16_gemm as lowp  # noqa: E402
from normlab.torch.training import _gemm  # noqa: E402
from normlab.torch.training import _product_ops as products  # noqa: E402

EPS32 = 2.0**-23
U = 2.0**-8  # bfloat16's unit roundoff
RECIPES = {
    "bf16": nt.Bf16Recipe(),
    "fp8-delayed": nt.Fp8DelayedRecipe(),
    "fp8-current": nt.Fp8CurrentRecipe(),
    "mx": nt.MXRecipe(),
    "nvfp4": nt.NVFP4Recipe(),
    "blockwise": nt.BlockwiseFp8Recipe(),
    "blockwise-pow2": nt.BlockwiseFp8Recipe(power_of_2_scales=True),
    "rowwise": nt.Fp8RowwiseRecipe(),
    "rowwise-gw-hp": nt.Fp8RowwiseRecipe(grad_weight_high_precision=True),
}
EXACT = {"bf16", "fp8-delayed", "fp8-current", "mx", "nvfp4", "blockwise-pow2", "rowwise",
         "rowwise-gw-hp"}


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """One bfloat16 unit in the last place of |t| (float64; normal range)."""
    a = t.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


@pytest.mark.parametrize("shape", [(64, 4096, 48), (33, 1000, 17), (256, 512, 384)])
def test_torch_bf16_matmul_accumulates_in_float32_and_rounds_once(shape):
    # products of small integers: every partial sum is exact in float32 (< 2^24) but not in
    # bfloat16 (above 2^8), so only float32 accumulation with one final rounding gives
    # bfloat16(exact sum) everywhere
    m, k, n = shape
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-8, 9, (m, k), generator=g).to(torch.bfloat16)
    b = torch.randint(-8, 9, (k, n), generator=g).to(torch.bfloat16)
    exact = a.double() @ b.double()
    assert exact.abs().max() > 2**8  # partial sums need more than bfloat16's 8 bits
    assert torch.equal(a @ b, exact.float().to(torch.bfloat16))


def test_exact_in_bf16_follows_the_significand_bits():
    fp16_bf16 = nt.Bf16Recipe(fmt="fp16")
    for name, r in RECIPES.items():
        for role in ("x", "w", "dy"):
            for axis in (0, 1):
                # as a bfloat16 layer runs it (an unquantised operand: rounding to bfloat16)
                q = r.quantizer(role, axis).for_input(BFLOAT16)
                assert lowp.exact_in_bf16(q) is (name in EXACT), (name, role, axis)
    assert not lowp.exact_in_bf16(fp16_bf16.quantizer("x", 1))


def _layer_operands(r, x, w, dy):
    """Each GEMM's two operands as the layer makes them (forward, dgrad, wgrad)."""
    layer = nt.QuantLinear(x.shape[1], w.shape[0], bias=False, recipe=r, dtype=x.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    for _ in range(2):  # delayed scaling: the second forward uses the recorded amaxes
        qx, qw, saved, w_scale = _gemm.forward_operands(layer, x, w)
    dy_n, w_n, dy_m, x_m = _gemm.backward_operands(layer, dy, w, saved, w_scale)
    op = _gemm._operand  # the layer's quantizer for the operand's dtype, and its scale
    return [
        (op(layer, qx, "x", 1, x), op(layer, qw, "w", 1, w), {"trans_b": True}),
        (op(layer, dy_n, "dy", 1, dy), op(layer, w_n, "w", 0, w), {}),
        (op(layer, dy_m, "dy", 0, dy, hadamard=_gemm._hadamard(layer)),
         lowp.GemmOperand(x_m, saved.spec, parts=saved.parts), {"trans_a": True}),
    ]


@pytest.mark.parametrize("name", sorted(EXACT))
def test_elements_are_recovered_exactly(name):
    # the bfloat16 elements times the factor give back the exact path's values bit for bit
    g = torch.Generator().manual_seed(3)
    scales = torch.exp2(torch.randint(-6, 7, (96, 1), generator=g).double())
    x = (torch.randn(96, 256, generator=g, dtype=torch.float64) * scales).to(torch.bfloat16)
    w = (torch.randn(160, 256, generator=g) * 0.05).to(torch.bfloat16)
    dy = (torch.randn(96, 160, generator=g) * 1e-3).to(torch.bfloat16)
    for a, b, _ in _layer_operands(RECIPES[name], x, w, dy):
        for op in (a, b):
            f = lowp._factor(op)
            e = (op.values if f is None else op.values / f).to(torch.bfloat16)
            back = e.to(torch.float32) if f is None else e.to(torch.float32) * f
            assert torch.equal(back, op.values)


@pytest.mark.parametrize("name", sorted(EXACT))
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_gemm_within_the_bound_of_the_exact_path(name, with_bias):
    g = torch.Generator().manual_seed(5)
    scales = torch.exp2(torch.randint(-6, 7, (128, 1), generator=g).double())
    x = (torch.randn(128, 512, generator=g, dtype=torch.float64) * scales).to(torch.bfloat16)
    w = (torch.randn(192, 512, generator=g) * 0.05).to(torch.bfloat16)
    dy = (torch.randn(128, 192, generator=g) * 1e-2).to(torch.bfloat16)
    differs = 0
    for a, b, kw in _layer_operands(RECIPES[name], x, w, dy):
        out_n = (b.values.shape[0] if kw.get("trans_b") else b.values.shape[1])
        bias = torch.randn(out_n, generator=g) if with_bias else None
        got = lowp.gemm(a, b, bias, **kw)
        want = products.gemm(a.values, b.values, bias, **kw)
        ta = a.values.t() if kw.get("trans_a") else a.values
        tb = b.values.t() if kw.get("trans_b") else b.values
        k = ta.shape[1]
        plain = want.double() - (0 if bias is None else bias.double())
        acc = ta.double().abs() @ tb.double().abs() + (0 if bias is None else bias.abs())
        tol = U * plain.abs() + 2 * (k + 2) * EPS32 * acc
        assert ((got.double() - want.double()).abs() <= tol).all()
        differs += int((got != want).sum())
    if name not in ("bf16", "mx", "blockwise-pow2") or with_bias:
        assert differs > 0  # the bfloat16 path did run (it rounds where the exact path does not)


def _train(layer, x, g):
    xx = x.clone().requires_grad_()
    y = layer(xx)
    y.backward(g)
    return y.detach(), xx.grad, layer.weight.grad


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_bf16_layer_within_one_unit_of_exact_gemm(name):
    # the same layer, `exact_gemm` off and on: output and both gradients (bfloat16) at most
    # one bfloat16 unit apart, plus float32 accumulation (bounded through |x| |W|, with a
    # factor 4 for quantisation growing an operand's magnitude)
    torch.manual_seed(0)
    fast = nt.QuantLinear(256, 192, bias=False, recipe=RECIPES[name], dtype=torch.bfloat16)
    exact = copy.deepcopy(fast)
    exact.exact_gemm = True
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    dy = torch.randn(64, 192, generator=g).to(torch.bfloat16)
    w = fast.weight.detach()
    bounds = [x.double().abs() @ w.double().abs().t(), dy.double().abs() @ w.double().abs(),
              dy.double().abs().t() @ x.double().abs()]
    ks = [256, 192, 64]
    for _ in range(2):  # delayed scaling: the second step with the recorded amaxes
        got, want = _train(fast, x, dy), _train(exact, x, dy)
        fast.zero_grad()
        exact.zero_grad()
    for u, v, bound, k in zip(got, want, bounds, ks, strict=True):
        tol = _ulp(torch.maximum(u.double().abs(), v.double().abs())) \
            + 2 * (k + 2) * EPS32 * 4 * bound
        assert ((u.double() - v.double()).abs() <= tol).all()
    # with no per-tensor factor (scales of powers of two fold into the elements) the two
    # paths round alike; a factor applied after the bfloat16 rounding shows somewhere
    if name in EXACT - {"bf16", "mx", "blockwise-pow2", "rowwise", "rowwise-gw-hp"}:
        assert any(not torch.equal(u, v) for u, v in zip(got, want, strict=True))
    if name not in EXACT:  # no exact bfloat16 form: the float32 GEMM, bit for bit
        assert all(torch.equal(u, v) for u, v in zip(got, want, strict=True))


def test_float32_models_and_exact_gemm_keep_the_float32_path(monkeypatch):
    calls = []
    real = lowp._bf16_gemm_op
    monkeypatch.setattr(lowp, "_bf16_gemm_op", lambda *a: (calls.append(a), real(*a))[1])
    for dtype, exact in ((torch.float32, False), (torch.bfloat16, True)):
        layer = nt.QuantLinear(32, 16, recipe=nt.MXRecipe(), exact_gemm=exact, dtype=dtype)
        layer(torch.randn(8, 32, dtype=dtype, requires_grad=True)).sum().backward()
    assert calls == []
    layer = nt.QuantLinear(32, 16, recipe=nt.MXRecipe(), dtype=torch.bfloat16)
    layer(torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    assert len(calls) == 3  # forward, dgrad, wgrad


def test_convert_passes_exact_gemm_and_checks_it():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    nt.convert(net, nt.Fp8CurrentRecipe(), exact_gemm=True, keep_lm_head=False)
    assert all(m.exact_gemm for m in net)
    with pytest.raises(TypeError, match="exact_gemm must be a bool; got 1"):
        nt.convert(torch.nn.Sequential(torch.nn.Linear(8, 8)), nt.MXRecipe(), exact_gemm=1)
    with pytest.raises(TypeError, match="exact_gemm must be a bool"):
        nt.QuantLinear(8, 8, recipe=nt.MXRecipe(), exact_gemm="yes")


def test_gemm_refuses_an_operand_not_exact_in_bf16():
    r = nt.BlockwiseFp8Recipe()
    spec = r.quantizer("x", 1)
    a = lowp.GemmOperand(torch.ones(4, 128), spec)
    with pytest.raises(ValueError, match="a must be exact in bfloat16"):
        lowp.gemm(a, a, trans_b=True)


def test_bf16_rounding_of_a_bf16_tensor_multiplies_the_tensor_itself():
    # the Bf16 recipe's operand of a bf16 tensor is that tensor (rounding is the identity),
    # so the GEMM takes the source without a conversion pass; scaled kinds take the values
    x = torch.randn(16, 64).to(torch.bfloat16)
    for r, shortcut in ((nt.Bf16Recipe(), True), (nt.MXRecipe(), False)):
        spec = r.quantizer("x", 1)
        layer = nt.QuantLinear(64, 8, recipe=r, dtype=torch.bfloat16)
        values = _gemm.quantize_operand(layer, x, "x", axis=1)
        op = lowp.GemmOperand(values, spec, x)
        assert (lowp._unconverted(op, None) is x) is shortcut
        if shortcut:
            assert torch.equal(values, x.float())
