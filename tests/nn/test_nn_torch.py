"""normlab.nn modules against torch.nn (an independent reference), forward and backward.

Everything runs in float64; unless a test says otherwise the tolerance is rtol = 1e-10 with
a small atol: both sides evaluate the same formulas with different summation orders, so
they agree to a few hundred float64 ulps, while any wrong term differs at O(1).
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab import nn

torch = pytest.importorskip("torch")
F = torch.nn.functional
F64 = np.float64
RTOL, ATOL = 1e-10, 1e-12


def _t(a: np.ndarray, grad: bool = False):
    return torch.tensor(np.asarray(a, dtype=F64), requires_grad=grad)


def _close(ours, theirs, rtol: float = RTOL, atol: float = ATOL) -> None:
    ref = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    np.testing.assert_allclose(np.asarray(ours, dtype=F64), ref, rtol=rtol, atol=atol)


def _compare(ours: nn.Module, theirs, x: np.ndarray, pairs: dict[str, str]) -> None:
    """Copy our parameters into torch's, compare outputs, dx and parameter gradients."""
    named = dict(ours.named_parameters())
    tparams = dict(theirs.named_parameters())
    with torch.no_grad():
        for mine, their in pairs.items():
            tparams[their].copy_(_t(named[mine].data))
    theirs.zero_grad()
    xt = _t(x, grad=True)
    yt = theirs(xt)
    y = ours(x)
    _close(y, yt)
    dout = np.random.default_rng(7).normal(size=y.shape)
    yt.backward(_t(dout))
    ours.zero_grad()
    _close(ours.backward(dout), xt.grad)
    for mine, their in pairs.items():
        _close(named[mine].grad, tparams[their].grad)


def _randomise(module: nn.Module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for p in module.parameters():
        p.data = p.data + rng.normal(size=p.shape)


def test_layer_norm() -> None:
    ours = nn.LayerNorm((3, 4), eps=1e-5, dtype=F64)
    _randomise(ours, 0)
    theirs = torch.nn.LayerNorm((3, 4), eps=1e-5, dtype=torch.float64)
    x = np.random.default_rng(1).normal(size=(2, 3, 4)) * 3 + 1
    _compare(ours, theirs, x, {"weight": "weight", "bias": "bias"})


def test_rms_norm() -> None:
    ours = nn.RMSNorm(5, eps=1e-8, dtype=F64)
    _randomise(ours, 2)
    theirs = torch.nn.RMSNorm(5, eps=1e-8, dtype=torch.float64)
    _compare(ours, theirs, np.random.default_rng(3).normal(size=(4, 5)), {"weight": "weight"})


def test_group_norm() -> None:
    ours = nn.GroupNorm(3, 6, eps=1e-5, dtype=F64)
    _randomise(ours, 4)
    theirs = torch.nn.GroupNorm(3, 6, eps=1e-5, dtype=torch.float64)
    x = np.random.default_rng(5).normal(size=(2, 6, 2, 3))
    _compare(ours, theirs, x, {"weight": "weight", "bias": "bias"})


def test_linear() -> None:
    ours = nn.Linear(5, 3, rng=np.random.default_rng(6), dtype=F64)
    theirs = torch.nn.Linear(5, 3, dtype=torch.float64)
    _compare(ours, theirs, np.random.default_rng(7).normal(size=(2, 4, 5)),
             {"weight": "weight", "bias": "bias"})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    x = np.linspace(-9, 9, 301)
    # our erf is a series summed in float64 (absolute error < 3e-15): rtol 1e-12 on values
    # of order 1 and atol 1e-13 for the tiny negative tail
    ours, theirs = nn.GELU(approximate), torch.nn.GELU(approximate=approximate)
    theirs.zero_grad()
    xt = _t(x, grad=True)
    yt = theirs(xt)
    y = ours(x)
    _close(y, yt, rtol=1e-12, atol=1e-13)
    yt.backward(torch.ones_like(yt))
    _close(ours.backward(np.ones_like(y)), xt.grad, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_float32_is_correctly_rounded_to_about_one_ulp(approximate: str) -> None:
    x = np.linspace(-5, 5, 1001, dtype=np.float32)
    ref = torch.nn.GELU(approximate=approximate)(_t(x)).numpy()  # float64 reference
    y = nn.GELU(approximate)(x)
    assert y.dtype == np.float32
    # computed in float64 (erf to ~1e-10 for float32 outputs) then rounded once: within one
    # float32 ulp of the float64 value, i.e. relative 2^-23 ~ 1.2e-7 plus a tiny atol for
    # the tail below -4 where the values are ~1e-4 and the erf error dominates
    np.testing.assert_allclose(y, ref, rtol=1.2e-7, atol=1e-9)


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize(("axis", "shape"), [(-1, (8, 3)), (1, (4, 3, 2, 2))])
def test_batch_norm_momentum_mapping(unbiased: bool, axis: int, shape: tuple[int, ...]) -> None:
    # normlab keeps 0.9 of the old statistic; PyTorch's momentum=0.1 is the new batch's share
    ours = nn.BatchNorm(3, momentum=0.9, axis=axis, unbiased_running_var=unbiased, dtype=F64)
    cls = torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d
    theirs = cls(3, momentum=0.1, dtype=torch.float64)
    _randomise(ours, 8)
    rng = np.random.default_rng(9)
    for step in range(3):
        _compare(ours, theirs, rng.normal(size=shape) * 2 + step,
                 {"weight": "weight", "bias": "bias"})
    _close(ours.running_mean, theirs.running_mean)
    if unbiased:
        _close(ours.running_var, theirs.running_var)
    else:  # PyTorch always stores the unbiased variance: ours must differ
        assert not np.allclose(ours.running_var, theirs.running_var.numpy())
    ours.eval()
    theirs.eval()
    theirs.running_var.copy_(_t(ours.running_var))
    _compare(ours, theirs, rng.normal(size=shape), {"weight": "weight", "bias": "bias"})


def test_attention_matches_scaled_dot_product_attention() -> None:
    d, h = 8, 2
    attn = nn.CausalSelfAttention(d, h, rng=np.random.default_rng(10), dtype=F64)
    x = np.random.default_rng(11).normal(size=(2, 5, d))
    w = {n: _t(p.data, grad=True) for n, p in attn.named_parameters()}
    xt = _t(x, grad=True)

    def heads(name: str):
        a = xt @ w[f"{name}.weight"].T + w[f"{name}.bias"]
        return a.view(2, 5, h, d // h).transpose(1, 2)  # B,H,T,S

    y = F.scaled_dot_product_attention(heads("query"), heads("key"), heads("value"),
                                       is_causal=True)
    yt = y.transpose(1, 2).reshape(2, 5, d) @ w["out.weight"].T + w["out.bias"]
    ours = attn(x)
    _close(ours, yt)
    dout = np.random.default_rng(12).normal(size=ours.shape)
    yt.backward(_t(dout))
    _close(attn.backward(dout), xt.grad)
    for name, p in attn.named_parameters():
        _close(p.grad, w[name].grad)


def test_cross_entropy_value_and_gradient() -> None:
    rng = np.random.default_rng(13)
    logits = rng.normal(size=(3, 4, 6)) * 5
    targets = rng.integers(0, 6, size=(3, 4))
    lt = _t(logits, grad=True)
    ref = F.cross_entropy(lt.reshape(-1, 6), torch.tensor(targets.reshape(-1)))
    ref.backward()
    loss, dlogits = nn.softmax_cross_entropy(logits, targets)
    _close(loss, ref)
    _close(dlogits, lt.grad)
    loss_sum, dsum = nn.softmax_cross_entropy(logits, targets, reduction="sum")
    _close(loss_sum, ref * 12)
    _close(dsum, lt.grad * 12)


def test_cross_entropy_is_stable_for_huge_logits_in_float32() -> None:
    rng = np.random.default_rng(14)
    logits = (rng.normal(size=(4, 5)) * 1e4).astype(np.float32)
    targets = rng.integers(0, 5, size=4)
    lt = _t(logits.astype(F64), grad=True)
    ref = F.cross_entropy(lt, torch.tensor(targets))
    ref.backward()
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow, no NaN
        loss, dlogits = nn.softmax_cross_entropy(logits, targets)
    assert dlogits.dtype == np.float32
    # float32 computation of a loss of order 1e4: relative 1e-6 (a few float32 ulps)
    _close(loss, ref, rtol=1e-6, atol=0)
    _close(dlogits, lt.grad, rtol=0, atol=1e-6)
