"""The Module protocol: registration, traversal, modes, state, caches, gradient accumulation."""

from __future__ import annotations

import numpy as np
import pytest

from normlab import nn

F64 = np.float64


def _mlp(seed: int = 0) -> nn.Sequential:
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Linear(3, 5, rng=rng, dtype=F64), nn.ReLU(), nn.LayerNorm(5, dtype=F64),
        nn.Linear(5, 2, rng=rng, dtype=F64),
    )


def test_named_parameters_are_dotted_and_in_registration_order() -> None:
    names = [n for n, _ in _mlp().named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    assert len(_mlp().parameters()) == 6


def test_parameter_attributes_used_by_optimizers() -> None:
    lin = nn.Linear(4, 3, rng=np.random.default_rng(0))
    p = lin.weight
    assert isinstance(p.data, np.ndarray) and p.data.shape == (3, 4) and p.grad is None
    assert p.name == "weight"


def test_linear_init_bounds_follow_pytorch() -> None:
    # U(-1/sqrt(in), 1/sqrt(in)) for weight and bias: every value inside the bound and the
    # spread fills it (max |w| above 0.9 bound for 4000 draws fails with prob ~ 0.1^4000).
    lin = nn.Linear(16, 250, rng=np.random.default_rng(0))
    bound = 1 / 4
    assert np.abs(lin.weight.data).max() <= bound
    assert np.abs(lin.weight.data).max() > 0.9 * bound
    assert lin.bias is not None and np.abs(lin.bias.data).max() <= bound


def test_backward_accumulates_like_pytorch() -> None:
    rng = np.random.default_rng(1)
    lin = nn.Linear(3, 2, rng=rng, dtype=F64)
    x = rng.normal(size=(4, 3))
    dout = rng.normal(size=(4, 2))
    lin(x)
    lin.backward(dout)
    assert lin.weight.grad is not None
    first = lin.weight.grad.copy()
    lin(x)
    lin.backward(dout)
    # the same contribution twice: exactly twice the first (x + x is exact in binary)
    np.testing.assert_array_equal(lin.weight.grad, 2 * first)
    lin.zero_grad()
    assert lin.weight.grad is None


def test_shared_parameter_gets_both_contributions_and_is_listed_once() -> None:
    rng = np.random.default_rng(2)
    lm = nn.TransformerLM(7, 4, 1, 1, 5, rng=rng, tie_weights=True, dtype=F64)
    names = [n for n, _ in lm.named_parameters()]
    assert "head.weight" not in names and names.count("token_embedding.weight") == 1
    ids = rng.integers(0, 7, size=(2, 4))
    targets = rng.integers(0, 7, size=(2, 4))
    lm.loss_and_grad(ids, targets)
    tied = lm.token_embedding.weight.grad
    assert tied is not None
    # recompute the two contributions separately with an untied twin holding equal values
    twin = nn.TransformerLM(7, 4, 1, 1, 5, rng=np.random.default_rng(2), dtype=F64)
    twin.load_state_dict({**lm.state_dict(), "head.weight": lm.token_embedding.weight.data})
    twin.loss_and_grad(ids, targets)
    emb, head = twin.token_embedding.weight.grad, twin.head.weight.grad
    assert emb is not None and head is not None
    # same arithmetic in a different summation order: float64 rounding only
    np.testing.assert_allclose(tied, emb + head, rtol=1e-12, atol=1e-15)


def test_backward_without_forward_raises_runtime_error() -> None:
    ln = nn.LayerNorm(3)
    with pytest.raises(RuntimeError, match="without a preceding forward"):
        ln.backward(np.ones((2, 3), dtype=np.float32))
    ln(np.ones((2, 3), dtype=np.float32))
    ln.backward(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(RuntimeError, match="forward"):  # the cache was consumed
        ln.backward(np.ones((2, 3), dtype=np.float32))


def test_train_eval_is_recursive() -> None:
    net = nn.Sequential(nn.Dropout(0.5, np.random.default_rng(0)), nn.BatchNorm(3))
    assert net.training and all(m.training for m in net)
    assert net.eval() is net
    assert not net.training and not any(m.training for m in net)
    net.train()
    assert all(m.training for m in net)


def test_state_dict_round_trip_includes_buffers() -> None:
    rng = np.random.default_rng(3)
    net = nn.Sequential(nn.Linear(3, 3, rng=rng), nn.BatchNorm(3))
    net(rng.normal(size=(8, 3)).astype(np.float32))  # moves the running statistics
    state = net.state_dict()
    assert list(state) == ["0.weight", "0.bias", "1.weight", "1.bias",
                           "1.running_mean", "1.running_var"]
    other = nn.Sequential(nn.Linear(3, 3, rng=np.random.default_rng(9)), nn.BatchNorm(3))
    other.load_state_dict(state)
    for key, value in other.state_dict().items():
        np.testing.assert_array_equal(value, state[key])
    x = rng.normal(size=(4, 3)).astype(np.float32)
    net.eval()
    other.eval()
    np.testing.assert_array_equal(net(x), other(x))
    # state_dict returns copies: editing it does not touch the module
    state["0.weight"][...] = 0
    assert np.any(net.state_dict()["0.weight"] != 0)


def test_load_state_dict_rejects_bad_state_without_changing_anything() -> None:
    net = _mlp()
    before = net.state_dict()
    bad = dict(before)
    bad["3.bias"] = np.zeros(7)
    with pytest.raises(ValueError, match=r"3.bias.*shape \(2,\)"):
        net.load_state_dict(bad)
    missing = dict(before)
    missing.pop("0.bias")
    with pytest.raises(ValueError, match="missing"):
        net.load_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected"):
        net.load_state_dict({**before, "extra": np.zeros(1)})
    for not_a_mapping in (None, list(before.items())):
        with pytest.raises(TypeError, match="state must be a mapping"):
            net.load_state_dict(not_a_mapping)
    for key, value in net.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_float32_parameters_compute_float64_inputs_in_float64() -> None:
    rng = np.random.default_rng(4)
    lin = nn.Linear(3, 2, rng=rng)
    x = rng.normal(size=(5, 3))
    y = lin(x)
    assert y.dtype == np.float64
    w = lin.weight.data.astype(np.float64)
    assert lin.bias is not None
    ref = x @ w.T + lin.bias.data.astype(np.float64)
    # the same float64 products; only the summation order may differ
    np.testing.assert_allclose(y, ref, rtol=1e-14, atol=1e-15)
    lin.backward(np.ones_like(y))
    assert lin.weight.grad is not None and lin.weight.grad.dtype == np.float64


def test_bfloat16_parameters_written_by_precision_code_are_used() -> None:
    import ml_dtypes

    rng = np.random.default_rng(5)
    lin = nn.Linear(4, 2, rng=rng)
    lin.weight.data = lin.weight.data.astype(ml_dtypes.bfloat16)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    y = lin(x)
    assert y.dtype == np.float32
    lin.backward(np.ones_like(y))
    assert lin.weight.grad is not None and lin.weight.grad.dtype == np.float32


@pytest.mark.parametrize(
    ("factory", "exc"),
    [
        (lambda: nn.Linear(0, 3, rng=np.random.default_rng(0)), ValueError),
        (lambda: nn.Linear(2.5, 3, rng=np.random.default_rng(0)), TypeError),
        (lambda: nn.Linear(2, 3, rng=0), TypeError),
        (lambda: nn.Linear(2, 3, rng=np.random.default_rng(0), init="he"), ValueError),
        (lambda: nn.LayerNorm(4, eps=0.0), ValueError),
        (lambda: nn.LayerNorm((4, 0)), ValueError),
        (lambda: nn.LayerNorm(()), ValueError),
        (lambda: nn.RMSNorm(4, eps=float("nan")), ValueError),
        (lambda: nn.GroupNorm(3, 4), ValueError),
        (lambda: nn.BatchNorm(3, momentum=1.5), ValueError),
        (lambda: nn.BatchNorm(True), TypeError),
        (lambda: nn.Dropout(1.0, np.random.default_rng(0)), ValueError),
        (lambda: nn.Dropout(float("nan"), np.random.default_rng(0)), ValueError),
        (lambda: nn.Dropout(0.1, None), TypeError),
        (lambda: nn.GELU("erf"), ValueError),
        (lambda: nn.CausalSelfAttention(6, 4, rng=np.random.default_rng(0)), ValueError),
        (lambda: nn.Residual(nn.ReLU(), nn.LayerNorm(2), placement="middle"), ValueError),
        (lambda: nn.Residual(np.ones(2), None), TypeError),
        (lambda: nn.Sequential(nn.ReLU(), "relu"), TypeError),
        (lambda: nn.TransformerBlock(8, 2, 16, norm="batch", rng=np.random.default_rng(0)),
         ValueError),
        (lambda: nn.TransformerLM(5, 8, 2, 0, 4, rng=np.random.default_rng(0)), ValueError),
        (lambda: nn.MLP(4, 8, rng=np.random.default_rng(0), activation="tanh"), ValueError),
    ],
)
def test_bad_constructor_arguments_raise(factory, exc) -> None:
    with pytest.raises(exc):
        factory()


def test_bad_forward_inputs_raise_and_leave_running_statistics_alone() -> None:
    bn = nn.BatchNorm(3)
    with pytest.raises(ValueError, match="num_features"):
        bn(np.ones((4, 2), dtype=np.float32))
    with pytest.raises(TypeError, match="dtype"):
        bn(np.ones((4, 3), dtype=np.int64))
    with pytest.raises(ValueError):  # one value per feature in training
        bn(np.ones((1, 3), dtype=np.float32))
    np.testing.assert_array_equal(bn.running_mean, np.zeros(3))
    np.testing.assert_array_equal(bn.running_var, np.ones(3))
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(4)(np.ones((2, 3)))
    with pytest.raises(ValueError, match="num_channels"):
        nn.GroupNorm(2, 4)(np.ones((2, 3, 5)))
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(3, 2, rng=np.random.default_rng(0))(np.ones((2, 4)))
    emb = nn.Embedding(5, 2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        emb(np.array([0, 5]))
    with pytest.raises(TypeError, match="integer"):
        emb(np.array([0.0, 1.0]))
    lm = nn.TransformerLM(5, 4, 1, 1, 3, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="context"):
        lm(np.zeros((1, 4), dtype=np.int64))


def test_deepcopy_and_pickle_keep_tied_weights_and_outputs() -> None:
    import copy
    import pickle

    lm = nn.TransformerLM(7, 8, 2, 2, 5, rng=np.random.default_rng(6), tie_weights=True)
    ids = np.array([[1, 2, 3]])
    for clone in (copy.deepcopy(lm), pickle.loads(pickle.dumps(lm))):
        assert clone.head.weight is clone.token_embedding.weight
        np.testing.assert_array_equal(clone(ids), lm(ids))


def test_clear_cache_forgets_every_forward() -> None:
    net = _mlp()
    net(np.ones((2, 3)))
    net.clear_cache()
    assert all(m.__dict__["_cache"] is None for _, m in net.named_modules())
    with pytest.raises(RuntimeError, match="forward"):
        net.backward(np.ones((2, 2)))


def test_param_dtype_is_a_deprecated_alias_of_compute_dtype() -> None:
    from normlab._validate import compute_dtype
    from normlab.nn.module import param_dtype

    for dt in (np.float16, np.float32, np.float64, np.dtype(">f8")):
        x = np.ones(2, dtype=dt)
        with pytest.warns(DeprecationWarning, match="compute_dtype"):
            assert param_dtype(x) == compute_dtype(x.dtype)
    assert compute_dtype(np.dtype(">f8")) == np.float64  # byte order never downgrades


def test_module_load_accepts_big_endian_state() -> None:
    net = nn.Sequential(nn.Linear(3, 2, rng=np.random.default_rng(0)), nn.BatchNorm(2))
    state = {k: v.astype(">f8") for k, v in net.state_dict().items()}
    other = nn.Sequential(nn.Linear(3, 2, rng=np.random.default_rng(1)), nn.BatchNorm(2))
    other.load_state_dict(state)
    for key, value in other.state_dict().items():
        assert value.dtype == net.state_dict()[key].dtype  # the module's dtype is kept
        np.testing.assert_array_equal(value, state[key])
