"""SGD / AdamW checkpoints, validation before any update, and non-native byte order.

Oracle for loading: an optimizer that never stopped (same code, same inputs). Oracle for
byte order: the same run with native '<f8' arrays, bit for bit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from normlab.checkpoint import load, save
from normlab.nn.optim import SGD, AdamW

SHAPES = [(3,), (2, 2)]


def _params(dtype: Any = np.float32, seed: int = 0) -> list[SimpleNamespace]:
    rng = np.random.default_rng(seed)
    return [SimpleNamespace(data=rng.standard_normal(s).astype(dtype), grad=None) for s in SHAPES]


def _grads(t: int, params: list[SimpleNamespace]) -> None:
    rng = np.random.default_rng(100 + t)
    for p in params:
        p.grad = rng.standard_normal(p.data.shape).astype(p.data.dtype)


MAKERS = {
    "sgd": lambda ps: SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "nesterov": lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adamw": lambda ps: AdamW(ps, lr=0.05, betas=(0.8, 0.99), weight_decay=0.1),
}


def _round_trip(state: Any) -> Any:
    import io
    buf = io.BytesIO()
    save(buf, state)
    buf.seek(0)
    return load(buf)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_load_state_dict_continues_exactly(kind: str) -> None:
    ref = _params()
    ref_opt = MAKERS[kind](ref)
    for t in range(6):
        _grads(t, ref)
        ref_opt.step()
    ps = _params()
    opt = MAKERS[kind](ps)
    for t in range(3):
        _grads(t, ps)
        opt.step()
    state = _round_trip({"opt": opt.state_dict(), "w": [p.data for p in ps]})
    resumed = [SimpleNamespace(data=w.copy(), grad=None) for w in state["w"]]
    fresh = MAKERS[kind](resumed)
    fresh.lr = 123.0  # hyperparameters come from the state as well
    fresh.load_state_dict(state["opt"])
    for t in range(3, 6):
        _grads(t, resumed)
        fresh.step()
    for p, r in zip(resumed, ref, strict=True):
        np.testing.assert_array_equal(p.data, r.data, strict=True)


def _adam_state() -> tuple[AdamW, dict[str, Any]]:
    ps = _params()
    opt = AdamW(ps)
    _grads(0, ps)
    opt.step()
    return opt, opt.state_dict()


def _with(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    import copy
    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


BAD_STATES = [
    (("state", 0, "exp_avg"), np.zeros(4), ValueError, "shape"),
    (("state", 0, "exp_avg_sq"), np.full(3, -1.0), ValueError, ">= 0"),
    (("state", 0, "step"), 0, ValueError, ">= 1"),
    (("state", 0, "step"), 1.5, TypeError, "integer"),
    (("state", 0, "extra"), 1, ValueError, "keys"),
    (("state", 5), {}, ValueError, "index"),
    (("param_groups", 0, "lr"), -1.0, ValueError, r"param_groups'\]\[0\]: lr"),
    (("param_groups", 0, "betas"), (0.9, 1.0), ValueError, r"param_groups'\]\[0\]: betas"),
    (("param_groups", 0, "params"), [0], ValueError, "params"),
    (("param_groups",), [], ValueError, "one group"),
]


@pytest.mark.parametrize(("path", "value", "exc", "match"), BAD_STATES)
def test_bad_state_is_rejected_and_changes_nothing(path: tuple[Any, ...], value: Any,
                                                   exc: type, match: str) -> None:
    opt, state = _adam_state()
    before = opt.state_dict()
    opt.lr = 0.5
    with pytest.raises(exc, match=match):
        opt.load_state_dict(_with(state, path, value))
    assert opt.lr == 0.5
    after = opt.state_dict()["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(after[0][key], before["state"][0][key])
    assert after[0]["step"] == 1


def test_loaded_state_takes_the_parameters_state_dtype() -> None:
    ps = _params(np.float64)
    opt = AdamW(ps)
    _, state = _adam_state()  # float32 moments
    opt.load_state_dict(state)
    assert opt.state[0]["exp_avg"].dtype == np.float64
    # 0-d arrays (np.load) are accepted for every scalar
    sgd = SGD(_params(), lr=0.1, momentum=0.5)
    sgd.load_state_dict({"state": {np.int64(0): {"momentum_buffer": np.ones(3)}},
                         "param_groups": [{"lr": np.array(0.2), "momentum": np.array(0.5),
                                           "dampening": np.array(0.0),
                                           "weight_decay": np.array(0.0),
                                           "nesterov": np.array(False), "params": [0, 1]}]})
    assert sgd.lr == 0.2 and sgd.nesterov is False


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_step_validates_every_parameter_before_updating_any(kind: str) -> None:
    ps = _params()
    _grads(0, ps)
    ps[1].data.flags.writeable = False
    opt = MAKERS[kind](ps)
    first = ps[0].data.copy()
    with pytest.raises(ValueError, match=r"params\[1\]\.data must be writeable"):
        opt.step()
    np.testing.assert_array_equal(ps[0].data, first)
    assert opt.state == {}
    ps[1].data = np.ones(3, np.float32)  # a shape that no longer matches its gradient
    with pytest.raises(ValueError, match=r"params\[1\]\.grad"):
        opt.step()
    ps[1].data = np.array([1, 2], dtype=np.int64)
    with pytest.raises(TypeError, match=r"params\[1\]\.data"):
        opt.step()
    np.testing.assert_array_equal(ps[0].data, first)


def test_step_rejects_parameter_replaced_after_state_exists() -> None:
    ps = _params()
    opt = AdamW(ps)
    _grads(0, ps)
    opt.step()
    ps[0].data = np.zeros(3, np.float64)  # now float64: its float32 moments no longer fit
    _grads(1, ps)
    before = ps[1].data.copy()
    with pytest.raises(ValueError, match=r"state\[0\]"):
        opt.step()
    np.testing.assert_array_equal(ps[1].data, before)


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_big_endian_parameters_are_computed_in_float64(kind: str) -> None:
    native, swapped = _params(np.float64), _params(np.dtype(">f8"))
    opt_n, opt_s = MAKERS[kind](native), MAKERS[kind](swapped)
    for t in range(3):
        _grads(t, native)
        _grads(t, swapped)
        opt_n.step()
        opt_s.step()
    for a, b in zip(native, swapped, strict=True):
        assert b.data.dtype == np.dtype(">f8")  # the caller's byte order is kept
        np.testing.assert_array_equal(a.data, b.data.astype(np.float64))
    for st in opt_s.state.values():
        for v in st.values():
            if isinstance(v, np.ndarray):
                assert v.dtype == np.float64
