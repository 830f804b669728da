"""Float64 gradient checks of every module's backward: input and every parameter.

Tolerance: ``module_gradcheck`` compares with central differences (h = 1e-6, error O(h^2)
plus float64 rounding ~1e-10 / h); a correct backward scores about 1e-9 and a wrong term
O(1), so TOL = 1e-6 leaves three orders of margin on each side.
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab import GradcheckError, gradcheck, nn
from normlab._backend import use_backend

F64 = np.float64
TOL = 1e-6


@pytest.fixture(autouse=True)
def _numpy_references():
    # A finite-difference check runs forward thousands of times on tiny arrays, where the
    # start-up cost of a parallel kernel call dominates; the kernels are checked against
    # these references in their own tests, and this module checks the layers' composition.
    with use_backend("numpy"):
        yield


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check(module: nn.Module, x: np.ndarray, **kw) -> None:
    err = nn.module_gradcheck(module, x, rng=_rng(99), tol=TOL, **kw)
    assert err <= TOL


def _without_key_bias(module: nn.Module) -> list[str]:
    # softmax is invariant to adding q.b_K to a whole row, so d L / d b_K is exactly zero in
    # exact arithmetic; a relative error against finite-difference noise is meaningless.
    return [n for n, _ in module.named_parameters() if not n.endswith("key.bias")]


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    _check(nn.Linear(4, 3, bias, rng=_rng(), dtype=F64), _rng(1).normal(size=(2, 3, 4)))


def test_embedding_parameter_gradient_scatter_adds_repeated_ids() -> None:
    emb = nn.Embedding(6, 3, rng=_rng(), dtype=F64)
    _check(emb, np.array([[0, 2, 2], [5, 0, 2]]))


@pytest.mark.parametrize("module", [nn.GELU(), nn.GELU("tanh"), nn.ReLU()], ids=repr)
def test_activations(module: nn.Module) -> None:
    x = _rng(2).normal(size=(3, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep ReLU's kink out of the finite-difference stencil
    _check(module, x)


@pytest.mark.parametrize(
    "module",
    [
        nn.LayerNorm(5, dtype=F64),
        nn.LayerNorm(5, elementwise_affine=False),
        nn.LayerNorm(5, bias=False, dtype=F64),
        nn.LayerNorm((3, 5), dtype=F64),
        nn.RMSNorm(5, dtype=F64),
        nn.RMSNorm(5, elementwise_affine=False),
        nn.RMSNorm(5, offset=1.0, dtype=F64),
    ],
    ids=repr,
)
def test_row_norms(module: nn.Module) -> None:
    x = _rng(3).normal(size=(2, 3, 5))
    # non-trivial affine parameters so that their gradients reach every term
    for p in module.parameters():
        p.data = p.data + _rng(4).normal(size=p.shape)
    _check(module, x)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(2, 4, 3), (2, 4, 2, 3)])
def test_group_norm(affine: bool, shape: tuple[int, ...]) -> None:
    gn = nn.GroupNorm(2, 4, affine=affine, dtype=F64)
    for p in gn.parameters():
        p.data = p.data + _rng(5).normal(size=p.shape)
    _check(gn, _rng(6).normal(size=shape))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(("axis", "shape"), [(-1, (6, 3)), (1, (4, 3, 2, 2))])
def test_batch_norm_train_and_eval(training: bool, axis: int, shape: tuple[int, ...]) -> None:
    bn = nn.BatchNorm(3, axis=axis, dtype=F64)
    bn.running_mean[...] = [0.5, -1.0, 2.0]
    bn.running_var[...] = [0.5, 2.0, 1.5]
    for p in bn.parameters():
        p.data = p.data + _rng(7).normal(size=p.shape)
    bn.train(training)
    before = bn.state_dict()
    _check(bn, _rng(8).normal(size=shape))
    for key, value in bn.state_dict().items():  # the check restores the running statistics
        np.testing.assert_array_equal(value, before[key])


@pytest.mark.parametrize("training", [True, False])
def test_dropout(training: bool) -> None:
    drop = nn.Dropout(0.4, _rng(9)).train(training)
    _check(drop, _rng(10).normal(size=(4, 6)))


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("norm", ["layer", "rms", "batch", "none"])
def test_residual(placement: str, norm: str) -> None:
    norms = {
        "layer": lambda: nn.LayerNorm(4, dtype=F64),
        "rms": lambda: nn.RMSNorm(4, dtype=F64),
        "batch": lambda: nn.BatchNorm(4, dtype=F64),  # not fusable: composed path
        "none": lambda: None,
    }
    sub = nn.Sequential(nn.Linear(4, 6, rng=_rng(), dtype=F64), nn.GELU(),
                        nn.Linear(6, 4, rng=_rng(1), dtype=F64))
    block = nn.Residual(sub, norms[norm](), placement)
    for p in block.parameters():
        p.data = p.data + 0.3 * _rng(11).normal(size=p.shape)
    names = [n for n, _ in block.named_parameters()]
    if norm == "batch" and placement == "post":
        # BatchNorm (training) removes each feature's batch mean, so a bias added just
        # before it has an exactly zero gradient: nothing to compare a relative error with
        names.remove("sublayer.2.bias")
    _check(block, _rng(12).normal(size=(5, 4)), params=names)


def test_sequential_and_pre_norm_stack() -> None:
    blocks = [nn.Residual(nn.Linear(4, 4, rng=_rng(i), dtype=F64), nn.LayerNorm(4, dtype=F64))
              for i in range(3)]
    _check(nn.PreNormStack(blocks, nn.RMSNorm(4, dtype=F64)), _rng(13).normal(size=(2, 3, 4)))


@pytest.mark.parametrize("zero_qk", [False, True])
def test_attention(zero_qk: bool) -> None:
    attn = nn.CausalSelfAttention(6, 2, rng=_rng(), zero_qk=zero_qk, dtype=F64)
    x = _rng(14).normal(size=(2, 4, 6))
    _check(attn, x, params=_without_key_bias(attn))
    attn(x)
    attn.backward(_rng(15).normal(size=x.shape))
    assert attn.key.bias is not None and attn.key.bias.grad is not None
    # exactly zero in exact arithmetic; float64 rounding of O(1) terms leaves ~1e-15
    np.testing.assert_allclose(attn.key.bias.grad, 0.0, atol=1e-12)


def test_mlp_relu_and_gelu() -> None:
    for act in ("gelu", "relu"):
        _check(nn.MLP(4, 8, rng=_rng(), activation=act, dtype=F64),
               _rng(16).normal(size=(3, 4)))


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("training", [True, False])
def test_transformer_block(placement: str, norm: str, training: bool) -> None:
    blk = nn.TransformerBlock(6, 2, 8, placement, norm, dropout=0.2, rng=_rng(), dtype=F64)
    blk.train(training)
    _check(blk, _rng(17).normal(size=(2, 3, 6)), params=_without_key_bias(blk))


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_language_model_loss_end_to_end(placement: str) -> None:
    rng = _rng(18)
    # embed_std=1: with GPT-2's 0.02 the post-norm queries and keys see tiny inputs and their
    # gradients (~1e-8) drown in finite-difference noise
    lm = nn.TransformerLM(7, 6, 2, 2, 5, placement, rng=rng, tie_weights=True, embed_std=1.0,
                          dtype=F64)
    ids = rng.integers(0, 7, size=(2, 5))
    targets = rng.integers(0, 7, size=(2, 5))
    params = [p for n, p in lm.named_parameters() if not n.endswith("key.bias")]

    def forward(*values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for p, v in zip(params, values, strict=True):
            p.data = v
        loss, dlogits = nn.softmax_cross_entropy(lm(ids), targets)
        return np.array(loss), dlogits

    def backward(dloss: np.ndarray, dlogits: np.ndarray) -> list[np.ndarray | None]:
        lm.zero_grad()
        lm.backward(float(dloss) * dlogits)
        return [p.grad for p in params]

    # directional checks: 4 random unit directions per parameter keep this under a second
    err = gradcheck(forward, backward, [p.data for p in params], rng=_rng(19),
                    mode="directional", num_directions=4, tol=TOL)
    assert err <= TOL


def test_pre_norm_identity_path_is_exact() -> None:
    # chapter 16.2: x_{l+1} = x_l + F(Norm(x_l)); with F's output zeroed dx == dout exactly
    rng = _rng(20)
    lin = nn.Linear(4, 4, rng=rng)
    lin.weight.data[...] = 0
    assert lin.bias is not None
    lin.bias.data[...] = 0
    block = nn.Residual(lin, nn.LayerNorm(4))
    x = rng.normal(size=(3, 4)).astype(np.float32)
    dout = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_array_equal(block(x), x)
    np.testing.assert_array_equal(block.backward(dout), dout)
    # the same for a whole pre-norm Transformer block whose branch outputs are zeroed
    blk = nn.TransformerBlock(4, 2, 8, "pre", rng=rng)
    for p in (blk.attention.out.weight, blk.attention.out.bias,
              blk.ffn.fc2.weight, blk.ffn.fc2.bias):
        assert p is not None
        p.data[...] = 0
    x3, d3 = x[None], dout[None]
    np.testing.assert_array_equal(blk(x3), x3)
    np.testing.assert_array_equal(blk.backward(d3), d3)
    # post-norm routes the identity path through the norm's Jacobian: not the identity
    post = nn.Residual(lin, nn.LayerNorm(4), "post")
    post(x)
    assert not np.allclose(post.backward(dout), dout)


@pytest.mark.parametrize(
    "module",
    [
        nn.Linear(4, 4, rng=_rng()), nn.GELU(), nn.ReLU(), nn.LayerNorm(4), nn.RMSNorm(4),
        nn.BatchNorm(4), nn.Dropout(0.3, _rng()), nn.MLP(4, 8, rng=_rng()),
        nn.Residual(nn.Linear(4, 4, rng=_rng()), nn.LayerNorm(4), "post"),
        nn.CausalSelfAttention(4, 2, rng=_rng()),
        nn.TransformerBlock(4, 2, 8, "pre", "rms", 0.1, rng=_rng()),
    ],
    ids=repr,
)
def test_float32_in_float32_out(module: nn.Module) -> None:
    x = _rng(21).normal(size=(2, 3, 4)).astype(np.float32)
    y = module(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    dx = module.backward(np.ones_like(y))
    assert dx is not None and dx.dtype == np.float32 and np.all(np.isfinite(dx))


class _WrongScale(nn.Module):
    """y = 2x with a backward that forgets the factor 2."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._save((x,))
        return 2 * x

    def backward(self, dout: np.ndarray) -> np.ndarray:
        self._take()
        return dout


def test_module_gradcheck_catches_a_wrong_backward_and_restores_parameters() -> None:
    with pytest.raises(GradcheckError):
        nn.module_gradcheck(_WrongScale(), _rng(22).normal(size=(2, 3)), rng=_rng(23), tol=TOL)
    lin = nn.Linear(3, 2, rng=_rng(24))
    before = lin.weight.data
    nn.module_gradcheck(lin, _rng(25).normal(size=(2, 3)), rng=_rng(26), tol=TOL)
    assert lin.weight.data is before and lin.weight.data.dtype == np.float32
    assert lin.weight.grad is None
