"""Bad input: each public function rejects it with ValueError/TypeError naming the argument
and the value received, before any state changes (running statistics untouched).
"""

from __future__ import annotations

import numpy as np
import pytest

import normlab as nl

X = np.ones((4, 3))
INT_X = np.ones((4, 3), dtype=np.int64)
BOOL_X = np.ones((4, 3), dtype=bool)
COMPLEX_X = np.ones((4, 3), dtype=np.complex128)


def _ln(**kw):
    args = {"x": X, "gamma": np.ones(3), "beta": np.zeros(3)} | kw
    return nl.layer_norm_forward(args.pop("x"), args.pop("gamma"), args.pop("beta"), **args)


@pytest.mark.parametrize(("kwargs", "exc", "pattern"), [
    ({"x": INT_X}, TypeError, r"x must have a real floating dtype.*got dtype int64"),
    ({"x": BOOL_X}, TypeError, r"x must have a real floating dtype.*got dtype bool"),
    ({"x": COMPLEX_X}, TypeError, r"x must have a real floating dtype.*complex128"),
    ({"x": None}, TypeError, r"x must be a real floating-point array"),
    ({"x": np.float64(1.0)}, ValueError, r"x must have at least 1 dimension"),
    ({"gamma": np.ones(4)}, ValueError, r"gamma must have shape \(3,\).*got shape \(4,\)"),
    ({"beta": np.ones((4, 3))}, ValueError, r"beta must have shape \(3,\).*got shape \(4, 3\)"),
    ({"gamma": np.ones(3, np.int32)}, TypeError, r"gamma must have a real floating dtype"),
    ({"eps": 0.0}, ValueError, r"eps must be > 0.*got 0.0"),
    ({"eps": -1e-5}, ValueError, r"eps must be > 0.*got -1e-05"),
    ({"eps": float("nan")}, ValueError, r"eps must be finite; got nan"),
    ({"eps": float("inf")}, ValueError, r"eps must be finite; got inf"),
    ({"eps": "1e-5"}, TypeError, r"eps must be a real number; got str"),
    ({"normalized_ndim": 0}, ValueError, r"normalized_ndim must be >= 1; got 0"),
    ({"normalized_ndim": 3, "gamma": None, "beta": None}, ValueError,
     r"normalized_ndim \(normalized_ndim\) must be <= x.ndim = 2.*got 3"),
    ({"normalized_ndim": 1.0}, TypeError, r"normalized_ndim must be an integer"),
    ({"normalized_ndim": 2}, ValueError, r"gamma must have shape \(4, 3\).*got shape \(3,\)"),
    ({"gamma": np.ones((1, 4, 3))}, ValueError, r"\(gamma.ndim\) must be <= x.ndim = 2.*got 3"),
    ({"gamma": np.float64(1.0)}, ValueError, r"gamma must have at least one dimension"),
])
def test_layer_norm_forward(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _ln(**kwargs)


def test_norm_backwards_check_cache_and_dout():
    _, ln_cache = nl.layer_norm_forward(X, None, None)
    _, rms_cache = nl.rms_norm_forward(X, None)
    for bwd, cache in ((nl.layer_norm_backward, ln_cache), (nl.rms_norm_backward, rms_cache),
                       (nl.batch_norm_backward, nl.batch_norm_forward(X, None, None, None,
                                                                      None, True)[1]),
                       (nl.group_norm_backward, nl.group_norm_forward(X, 3, None, None)[1])):
        with pytest.raises(ValueError, match=r"dout must have shape \(4, 3\).*got shape \(3, 4\)"):
            bwd(np.ones((3, 4)), cache)
        with pytest.raises(TypeError, match=r"dout must have a real floating dtype"):
            bwd(INT_X, cache)
        with pytest.raises(TypeError, match=r"cache must be the \w+Cache"):
            bwd(X, (X, None))
    with pytest.raises(TypeError, match="cache must be the RMSNormCache"):
        nl.rms_norm_backward(X, ln_cache)


@pytest.mark.parametrize(("kwargs", "exc", "pattern"), [
    ({"weight": np.ones(2)}, ValueError, r"weight must have shape \(3,\).*got shape \(2,\)"),
    ({"offset": float("nan")}, ValueError, r"offset must be finite; got nan"),
    ({"offset": "1"}, TypeError, r"offset must be a real number"),
    ({"eps": 0}, ValueError, r"eps must be > 0"),
    ({"x": INT_X}, TypeError, r"x must have a real floating dtype"),
])
def test_rms_norm_forward(kwargs, exc, pattern):
    args = {"x": X, "weight": np.ones(3)} | kwargs
    with pytest.raises(exc, match=pattern):
        nl.rms_norm_forward(args.pop("x"), args.pop("weight"), **args)


def test_add_norms():
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 3\).*got shape \(4,\)"):
        nl.add_layer_norm_forward(X, np.ones(4), None, None)
    with pytest.raises(TypeError, match=r"residual must have a real floating dtype"):
        nl.add_rms_norm_forward(X, BOOL_X, None)
    with pytest.raises(ValueError, match="eps must be > 0"):
        nl.add_rms_norm_forward(X, X, None, -1.0)


def _bn_state():
    return np.zeros(3), np.ones(3)


BN_CASES = [
    ({"x": INT_X}, TypeError, r"x must have a real floating dtype"),
    ({"gamma": np.ones(4)}, ValueError, r"gamma must have shape \(3,\).*got shape \(4,\)"),
    ({"beta": np.ones((1, 3))}, ValueError, r"beta must have shape \(3,\)"),
    ({"running_mean": np.zeros(4)}, ValueError, r"running_mean must have shape \(3,\).*\(4,\)"),
    ({"running_var": np.ones(2)}, ValueError, r"running_var must have shape \(3,\).*\(2,\)"),
    ({"running_mean": [0.0, 0.0, 0.0]}, TypeError, r"running_mean must be a numpy array"),
    ({"running_var": np.ones(3, np.int64)}, TypeError, r"running_var must have a real floating"),
    ({"running_var": -np.ones(3)}, ValueError, r"running_var must be >= 0; got .*-1.0"),
    ({"training": "yes"}, TypeError, r"training must be a bool.*'yes'"),
    ({"training": False, "running_mean": None}, ValueError, r"running_mean is required in eval"),
    ({"momentum": 1.5}, ValueError, r"momentum must be in \[0, 1\]; got 1.5"),
    ({"momentum": float("nan")}, ValueError, r"momentum must be in \[0, 1\]; got nan"),
    ({"eps": 0.0}, ValueError, r"eps must be > 0"),
    ({"axis": 2}, ValueError, r"axis must be in \[-2, 2\).*got 2"),
    ({"axis": 0.5}, TypeError, r"axis must be an integer"),
    ({"unbiased_running_var": 1}, TypeError, r"unbiased_running_var must be a bool"),
    ({"x": np.ones((1, 3))}, ValueError, r"more than one value per feature.*\(1, 3\)"),
]


@pytest.mark.parametrize(("kwargs", "exc", "pattern"), BN_CASES)
def test_batch_norm_forward_rejects_and_keeps_state(kwargs, exc, pattern):
    rm, rv = _bn_state()
    args = {"x": X * np.arange(4.0)[:, None], "gamma": np.ones(3), "beta": np.zeros(3),
            "running_mean": rm, "running_var": rv, "training": True} | kwargs
    with pytest.raises(exc, match=pattern):
        nl.batch_norm_forward(args.pop("x"), args.pop("gamma"), args.pop("beta"),
                              args.pop("running_mean"), args.pop("running_var"),
                              args.pop("training"), **args)
    np.testing.assert_array_equal(rm, np.zeros(3), strict=True)
    np.testing.assert_array_equal(rv, np.ones(3), strict=True)


def test_batch_norm_read_only_running_stats():
    rm, rv = _bn_state()
    rm.flags.writeable = False
    with pytest.raises(ValueError, match="running_mean must be writable"):
        nl.batch_norm_forward(X, None, None, rm, rv, True)
    np.testing.assert_array_equal(rv, np.ones(3), strict=True)
    nl.batch_norm_forward(X, None, None, rm, rv, False)  # eval only reads them


@pytest.mark.parametrize(("args", "exc", "pattern"), [
    ((np.ones(4), 2, None, None), ValueError, r"x must have at least 2 dimension"),
    ((INT_X, 3, None, None), TypeError, r"x must have a real floating dtype"),
    ((X, 2, None, None), ValueError, r"num_groups must divide.*= 3; got 2"),
    ((X, 3, np.ones(4), None), ValueError, r"gamma must have shape \(3,\)"),
    ((X, 3, None, np.ones(2)), ValueError, r"beta must have shape \(3,\)"),
    ((X, True, None, None), TypeError, r"num_groups must be an integer"),
])
def test_group_norm_forward(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        nl.group_norm_forward(*args)
    with pytest.raises(ValueError, match="eps must be > 0"):
        nl.group_norm_forward(X, 3, None, None, eps=-1.0)


@pytest.mark.parametrize(("p", "exc", "pattern"), [
    (1.0, ValueError, r"drop_probability must be in \[0, 1\); got 1.0"),
    (-0.1, ValueError, r"drop_probability must be in \[0, 1\); got -0.1"),
    (float("nan"), ValueError, r"drop_probability must be in \[0, 1\); got nan"),
    ("0.5", TypeError, r"drop_probability must be a real number.*'0.5'"),
    (None, TypeError, r"drop_probability must be a real number"),
    (True, TypeError, r"drop_probability must be a real number"),
])
def test_dropout_probability(p, exc, pattern):
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    with pytest.raises(exc, match=pattern):
        nl.inverted_dropout(X, p, rng)
    assert rng.bit_generator.state == state  # no draw before the check
    with pytest.raises(exc, match=pattern):
        nl.inverted_dropout_backward(X, X > 0, p)


def test_dropout_other_arguments():
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator.*RandomState"):
        nl.inverted_dropout(X, 0.5, np.random.RandomState(0))
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator.*NoneType"):
        nl.inverted_dropout(X, 0.5, None)
    with pytest.raises(TypeError, match=r"x must have a real floating dtype"):
        nl.inverted_dropout(INT_X, 0.5, np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"keep must be the bool mask.*float64"):
        nl.inverted_dropout_backward(X, X, 0.5)
    with pytest.raises(ValueError, match=r"keep must have shape \(4, 3\)"):
        nl.inverted_dropout_backward(X, np.ones(3, bool), 0.5)


@pytest.mark.parametrize(("call", "name"), [
    (lambda r: nl.layer_norm_forward(X, r, None), "gamma"),
    (lambda r: nl.layer_norm_forward(X, None, r), "beta"),
    (lambda r: nl.rms_norm_forward(X, r), "weight"),
    (lambda r: nl.add_rms_norm_forward(X, X, r), "weight"),
    (lambda r: nl.batch_norm_forward(X, r, None, np.zeros(3), np.ones(3), True), "gamma"),
])
def test_ragged_parameter_list_names_the_argument(call, name):
    with pytest.raises(TypeError, match=rf"^{name} must be a real floating-point array; got list"):
        call([[1.0, 2.0], [3.0]])
