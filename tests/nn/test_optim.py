"""SGD and AdamW: hand-computed steps, state dtype, skipping None grads, bad input."""

from __future__ import annotations

import math
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from normlab.nn.optim import SGD, AdamW


def _p(data: list[float], grad: list[float] | None, dtype: type = np.float32) -> SimpleNamespace:
    g = None if grad is None else np.array(grad, dtype=dtype)
    return SimpleNamespace(data=np.array(data, dtype=dtype), grad=g)


def test_sgd_plain_and_weight_decay() -> None:
    p = _p([1.0, -2.0], [0.5, 0.25], np.float64)
    SGD([p], lr=0.1, weight_decay=0.5).step()
    # g + wd * p = [1.0, -0.75]; p - 0.1 * g = [0.9, -1.925]
    np.testing.assert_allclose(p.data, [0.9, -1.925], rtol=0, atol=1e-15)  # float64 rounding


def test_sgd_momentum_dampening_and_nesterov_by_hand() -> None:
    p = _p([0.0], [1.0], np.float64)
    opt = SGD([p], lr=1.0, momentum=0.5, dampening=0.5)
    opt.step()  # first step: buffer = g = 1 (no dampening on the first step)
    assert p.data[0] == -1.0
    opt.step()  # buffer = 0.5 * 1 + 0.5 * 1 = 1
    assert p.data[0] == -2.0
    q = _p([0.0], [1.0], np.float64)
    nes = SGD([q], lr=1.0, momentum=0.5, nesterov=True)
    nes.step()  # buffer 1; update g + mu * b = 1.5
    nes.step()  # buffer 0.5 + 1 = 1.5; update 1 + 0.75 = 1.75
    assert q.data[0] == -3.25  # exact: dyadic numbers
    assert opt.state_dict()["state"][0]["momentum_buffer"].dtype == np.float64


def test_adamw_first_two_steps_by_hand() -> None:
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.1
    p = _p([1.0], [2.0], np.float64)
    opt = AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    opt.step()
    # step 1: m_hat = g, v_hat = g^2: p = 1 * (1 - lr*wd) - lr * g / (|g| + eps)
    expected = 1.0 * (1 - lr * wd) - lr * 2.0 / (2.0 + eps)
    np.testing.assert_allclose(p.data, [expected], rtol=1e-14)  # float64 rounding only
    p.grad = np.array([-1.0])
    opt.step()
    m = b1 * 0.1 * 2.0 + (1 - b1) * -1.0
    v = b2 * (1 - b2) * 4.0 + (1 - b2) * 1.0
    denom = math.sqrt(v) / math.sqrt(1 - b2**2) + eps
    expected = expected * (1 - lr * wd) - lr / (1 - b1**2) * m / denom
    np.testing.assert_allclose(p.data, [expected], rtol=1e-13)  # float64 rounding only
    assert opt.state_dict()["state"][0]["step"] == 2


def test_state_is_float32_for_low_precision_params() -> None:
    p = _p([1.0, 2.0], [0.5, 0.5], ml_dtypes.bfloat16)
    opt = AdamW([p], lr=0.01)
    opt.step()
    st = opt.state_dict()["state"][0]
    assert st["exp_avg"].dtype == np.float32 and st["exp_avg_sq"].dtype == np.float32
    assert p.data.dtype == ml_dtypes.bfloat16
    s = SGD([_p([1.0], [1.0], np.float16)], lr=0.1, momentum=0.9)
    s.step()
    assert s.state_dict()["state"][0]["momentum_buffer"].dtype == np.float32


def test_none_grad_skipped_and_zero_grad() -> None:
    a, b = _p([1.0], [1.0]), _p([5.0], None)
    opt = SGD([a, b], lr=0.5, momentum=0.9)
    opt.step()
    assert b.data[0] == 5.0 and 1 not in opt.state
    opt.zero_grad(set_to_none=False)
    assert a.grad is not None and a.grad[0] == 0.0
    opt.zero_grad()
    assert a.grad is None


def test_grad_not_modified_by_step() -> None:
    p = _p([1.0], [2.0])
    SGD([p], lr=0.1, momentum=0.9, weight_decay=0.1).step()
    assert p.grad[0] == 2.0


@pytest.mark.parametrize(
    ("cls", "kwargs", "exc"),
    [
        (SGD, {"lr": -1.0}, ValueError),
        (SGD, {"lr": 0.1, "momentum": -0.1}, ValueError),
        (SGD, {"lr": 0.1, "nesterov": True}, ValueError),
        (SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}, ValueError),
        (SGD, {"lr": float("nan")}, ValueError),
        (AdamW, {"betas": (1.0, 0.999)}, ValueError),
        (AdamW, {"betas": (0.9,)}, TypeError),
        (AdamW, {"eps": -1.0}, ValueError),
        (AdamW, {"weight_decay": -0.1}, ValueError),
    ],
)
def test_bad_hyperparameters(cls: type, kwargs: dict, exc: type) -> None:
    with pytest.raises(exc):
        cls([_p([1.0], [1.0])], **kwargs)


def test_bad_params_and_grads_change_nothing() -> None:
    with pytest.raises(ValueError):
        SGD([], lr=0.1)
    with pytest.raises(TypeError):
        SGD([object()], lr=0.1)
    with pytest.raises(TypeError):
        SGD([SimpleNamespace(data=np.array([1, 2]), grad=None)], lr=0.1)
    a, b = _p([1.0], [1.0]), _p([1.0, 2.0], [1.0])  # b's grad has the wrong shape
    opt = AdamW([a, b], lr=0.1)
    with pytest.raises(ValueError):
        opt.step()
    assert a.data[0] == 1.0 and opt.state == {}
    b.grad = np.array([1, 2])  # integer gradient
    with pytest.raises(TypeError):
        opt.step()
    assert a.data[0] == 1.0 and opt.state == {}
