"""Residual placements deepnorm / sandwich / admin / rezero: PyTorch autograd, gradcheck, state.

The PyTorch reference writes each placement's formula out with torch.nn.functional ops
(LN(alpha x + F(x)), x + LN_out(F(LN_in(x))), LN(omega * x + F(x)), x + alpha F(x)) and
lets autograd differentiate it; everything runs in float64, so the two sides agree to a few
hundred ulps (rtol 1e-10) while a missing or wrong term differs at O(1).
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab import nn

torch = pytest.importorskip("torch")
TF = torch.nn.functional
F64 = np.float64
RTOL, ATOL = 1e-10, 1e-12
C = 4


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _norm(kind: str) -> nn.Module:
    return nn.LayerNorm(C, dtype=F64) if kind == "layer" else nn.BatchNorm(C, dtype=F64)


def _block(placement: str, norm: str = "layer") -> nn.Residual:
    """A Linear sub-layer and random affine norms, so that no parameter sits at a symmetric
    point (gain 1, bias 0, omega 1, alpha 0) where a wrong term could vanish."""
    kw: dict = {"dtype": F64}
    if placement == "deepnorm":
        kw["alpha"] = 1.7
    elif placement == "sandwich":
        kw["out_norm"] = _norm(norm)
    elif placement == "admin":
        kw["omega"] = np.array([0.5, 1.5, 2.0, 3.0])
    elif placement == "rezero":
        kw["alpha"] = 0.3
    blk = nn.Residual(nn.Linear(C, C, rng=_rng(1), dtype=F64),
                      None if placement == "rezero" else _norm(norm), placement, **kw)
    for name, p in blk.named_parameters():
        if name.endswith(("norm.weight", "norm.bias")):
            p.data = p.data + 0.3 * _rng(len(name)).normal(size=p.shape)
    return blk


def _torch_forward(placement: str, params: dict, x):
    w, b = params["sublayer.weight"], params["sublayer.bias"]

    def ln(prefix: str, v):
        return TF.layer_norm(v, (C,), params[f"{prefix}.weight"], params[f"{prefix}.bias"], 1e-5)

    if placement == "deepnorm":
        return ln("norm", 1.7 * x + TF.linear(x, w, b))
    if placement == "sandwich":
        return x + ln("out_norm", TF.linear(ln("norm", x), w, b))
    if placement == "admin":
        return ln("norm", params["omega"] * x + TF.linear(x, w, b))
    return x + params["alpha"] * TF.linear(x, w, b)  # rezero


@pytest.mark.parametrize("placement", ["deepnorm", "sandwich", "admin", "rezero"])
def test_forward_and_backward_match_pytorch_autograd(placement: str) -> None:
    blk = _block(placement)
    x = _rng(2).normal(size=(3, 5, C))  # B,T,C
    dout = _rng(3).normal(size=x.shape)
    params = {n: torch.tensor(p.data, requires_grad=True) for n, p in blk.named_parameters()}
    xt = torch.tensor(x, requires_grad=True)
    yt = _torch_forward(placement, params, xt)
    (yt * torch.tensor(dout)).sum().backward()
    y = blk(x)
    dx = blk.backward(dout)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    for name, p in blk.named_parameters():
        np.testing.assert_allclose(p.grad, params[name].grad.numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=name)


@pytest.mark.parametrize("placement", ["deepnorm", "sandwich", "admin", "rezero"])
@pytest.mark.parametrize("norm", ["layer", "batch"])  # fused add+norm path / composed path
def test_gradcheck(placement: str, norm: str) -> None:
    blk = _block(placement, norm)
    x = _rng(4).normal(size=(6, C))
    names = [n for n, _ in blk.named_parameters()]
    if norm == "batch" and placement in ("deepnorm", "admin", "sandwich"):
        # BatchNorm (training) removes each feature's batch mean, so a bias added just
        # before it has an exactly zero gradient: no relative error to speak of
        names.remove("sublayer.bias")
    if norm == "batch" and placement == "sandwich":
        names.remove("norm.bias")  # the same: a constant shift through the Linear, then BN
    # central differences with h = 1e-6 in float64: truncation ~h^2, rounding ~1e-16/h
    assert nn.module_gradcheck(blk, x, rng=_rng(5), params=names) < 1e-6


def test_scalar_omega_gradient_is_the_sum_over_features() -> None:
    blk = nn.Residual(nn.Linear(C, C, rng=_rng(1), dtype=F64), nn.LayerNorm(C, dtype=F64),
                      "admin", omega=1.3, dtype=F64)
    assert blk.omega.shape == ()
    assert nn.module_gradcheck(blk, _rng(6).normal(size=(2, 3, C)), rng=_rng(7)) < 1e-6


def test_rezero_at_init_is_the_identity_and_trains_only_alpha_first() -> None:
    # y = x + 0 * F(x): forward is exactly x, dx exactly dout, F's weights get a zero
    # gradient and alpha gets <dout, F(x)> (Bachlechner et al. 2020, section 3)
    lin = nn.Linear(C, C, rng=_rng(1), dtype=F64)
    blk = nn.Residual(lin, None, "rezero", dtype=F64)
    x, dout = _rng(2).normal(size=(5, C)), _rng(3).normal(size=(5, C))
    assert np.array_equal(blk(x), x)
    assert np.array_equal(blk.backward(dout), dout)
    assert np.all(lin.weight.grad == 0) and np.all(lin.bias.grad == 0)
    f = x @ lin.weight.data.T + lin.bias.data
    np.testing.assert_allclose(blk.alpha.grad, np.sum(dout * f), rtol=1e-12)


def test_deepnorm_with_alpha_one_is_post_norm() -> None:
    post = nn.Residual(nn.Linear(C, C, rng=_rng(1), dtype=F64), nn.LayerNorm(C, dtype=F64),
                       "post")
    deep = nn.Residual(nn.Linear(C, C, rng=_rng(1), dtype=F64), nn.LayerNorm(C, dtype=F64),
                       "deepnorm", alpha=1.0)
    x, dout = _rng(2).normal(size=(5, C)), _rng(3).normal(size=(5, C))
    assert np.array_equal(post(x), deep(x))
    assert np.array_equal(post.backward(dout), deep.backward(dout))


def test_state_dict_holds_the_new_parameters_and_round_trips() -> None:
    for placement, key in (("admin", "omega"), ("rezero", "alpha"),
                           ("sandwich", "out_norm.weight")):  # fmt: skip
        blk = _block(placement)
        state = blk.state_dict()
        assert key in state
        other = _block(placement)
        state[key] = state[key] + 1.0
        other.load_state_dict(state)
        np.testing.assert_array_equal(dict(other.named_parameters())[key].data, state[key])
    assert "alpha" not in _block("deepnorm").state_dict()  # a constant, like eps


def test_deepnorm_constants_by_hand() -> None:
    # N = 8: alpha = 16^(1/4) = 2, beta = 64^(-1/4) = 1/(2 sqrt 2); N = 32: 64^(1/4) = 2 sqrt 2
    np.testing.assert_allclose(nn.deepnorm_constants(8), (2.0, 0.5 / np.sqrt(2)), rtol=1e-15)
    np.testing.assert_allclose(nn.deepnorm_constants(32, "encoder"), (2 * np.sqrt(2), 0.25),
                               rtol=1e-15)
    with pytest.raises(ValueError, match="architecture"):
        nn.deepnorm_constants(8, "encoder-decoder")


def test_deepnorm_init_scales_all_but_query_and_key() -> None:
    attn = nn.CausalSelfAttention(C, 2, rng=_rng(0), dtype=F64)
    before = {n: p.data.copy() for n, p in attn.named_parameters()}
    scaled = nn.deepnorm_init(attn, 0.25)
    assert sorted(scaled) == ["out.weight", "value.weight"]
    after = dict(attn.named_parameters())
    for name, value in before.items():
        factor = 0.25 if name in scaled else 1.0
        np.testing.assert_array_equal(after[name].data, value * factor)


def test_admin_initialize_follows_the_cumulative_variance() -> None:
    rng = _rng(0)
    blocks = [nn.Residual(nn.Linear(8, 8, rng=rng, dtype=F64), nn.LayerNorm(8, dtype=F64),
                          "admin", omega=np.ones(8), dtype=F64) for _ in range(4)]
    x = 2.0 * rng.standard_normal((256, 8))
    var = nn.admin_initialize(blocks, x)
    # recompute independently: x_i = LN(omega_i x + W x + b) with omega_i^2 = sum_{j<i} var_j
    h, total = x, np.var(x)
    np.testing.assert_allclose(var[0], total, rtol=1e-12)
    for i, blk in enumerate(blocks):
        np.testing.assert_allclose(blk.omega.data, np.full(8, np.sqrt(total)), rtol=1e-12)
        f = h @ blk.sublayer.weight.data.T + blk.sublayer.bias.data
        np.testing.assert_allclose(var[i + 1], np.var(f), rtol=1e-12)
        total += np.var(f)
        s = np.sqrt(var[: i + 1].sum()) * h + f
        h = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5)
    with pytest.raises(RuntimeError):  # profiling left no cache behind
        blocks[0].backward(np.ones((256, 8)))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"placement": "deepnorm"}, ValueError, "alpha"),
        ({"placement": "deepnorm", "alpha": 0.0}, ValueError, "alpha"),
        ({"placement": "pre", "alpha": 2.0}, ValueError, "alpha"),
        ({"placement": "sandwich"}, TypeError, "out_norm"),
        ({"placement": "post", "out_norm": nn.LayerNorm(C)}, ValueError, "out_norm"),
        ({"placement": "admin", "omega": np.ones((2, 2))}, ValueError, "omega"),
        ({"placement": "pre", "omega": 1.0}, ValueError, "omega"),
        ({"placement": "rezero"}, ValueError, "no norm"),
        ({"placement": "peri"}, ValueError, "placement"),
    ],
)
def test_bad_options_are_rejected(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        nn.Residual(nn.Linear(C, C, rng=_rng()), nn.LayerNorm(C), **kwargs)


def test_admin_omega_width_mismatch_is_rejected_before_anything_runs() -> None:
    blk = nn.Residual(nn.Linear(C, C, rng=_rng()), nn.LayerNorm(C), "admin", omega=np.ones(3))
    with pytest.raises(ValueError, match="omega"):
        blk(np.ones((2, C), dtype=np.float32))


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan")])
def test_deepnorm_init_rejects_a_beta_that_is_not_positive_and_changes_nothing(beta) -> None:
    lin = nn.Linear(C, C, rng=_rng())
    before = lin.weight.data.copy()
    with pytest.raises(ValueError, match="beta"):
        nn.deepnorm_init(lin, beta)
    np.testing.assert_array_equal(lin.weight.data, before)
