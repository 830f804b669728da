"""normlab.gradcheck: it accepts correct backwards, catches wrong ones, handles state.

Tolerance: 1e-6 throughout (float64 central differences with h = 1e-6 score ~1e-9 on a
correct backward; each wrong backward below is wrong by O(1e-2) or more).
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab import (
    batch_norm_backward,
    batch_norm_forward,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)
from normlab.gradcheck import GradcheckError, gradcheck

TOL = 1e-6


def _rms_backward_without_projection(dout, cache):
    """Wrong on purpose: treats 1/rms as a constant (drops the x_hat projection term)."""
    w = cache.weight
    return dout * w * cache.rstd[:, None], np.sum(dout * cache.x * cache.rstd[:, None], axis=0)


def _bn_backward_eval_formula_in_training(dout, cache):
    """Wrong on purpose: ignores that the batch statistics depend on x."""
    _, dg, db = batch_norm_backward(dout, cache)
    return dout * cache.gamma * cache.rstd, dg, db


def _ln_backward_scaled_gamma_grad(dout, cache):
    """Wrong on purpose: dgamma off by 1 %."""
    dx, dg, db = layer_norm_backward(dout, cache)
    return dx, dg * 1.01, db


@pytest.mark.parametrize("mode", ["full", "directional"])
def test_catches_wrong_backwards(rng, mode):
    x, w = rng.standard_normal((4, 6)), rng.standard_normal(6)
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(rms_norm_forward, _rms_backward_without_projection, (x, w), rng=rng,
                  mode=mode, tol=TOL)

    def bn(x, g, b):
        return batch_norm_forward(x, g, b, None, None, True)

    with pytest.raises(GradcheckError, match=r"x: relative error"):
        gradcheck(bn, _bn_backward_eval_formula_in_training, (x, w, w.copy()), rng=rng,
                  mode=mode, tol=TOL, names=["x", "gamma", "beta"])
    with pytest.raises(GradcheckError, match=r"gamma: relative error"):
        gradcheck(layer_norm_forward, _ln_backward_scaled_gamma_grad, (x, w, w.copy()),
                  rng=rng, mode=mode, tol=TOL, names=["x", "gamma", "beta"])
    # without tol the error is returned, and it is large
    err = gradcheck(layer_norm_forward, _ln_backward_scaled_gamma_grad, (x, w, w.copy()),
                    rng=rng, mode=mode)
    assert err > 1e-3


@pytest.mark.parametrize("mode", ["full", "directional"])
def test_accepts_correct_backward_and_float32_inputs(rng, mode):
    x, w = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(5)
    # float32 inputs are checked through float64 copies, so float32 noise does not show
    assert gradcheck(rms_norm_forward, rms_norm_backward, (x, w), rng=rng, mode=mode) < TOL
    assert x.dtype == np.float32


def test_stateful_forward_is_restored_before_each_evaluation(rng):
    x, rm, rv = rng.standard_normal((5, 3)), np.zeros(3), np.ones(3)

    def fwd(x, rm, rv):  # running statistics updated in place at every call
        return batch_norm_forward(x, None, None, rm, rv, True, 0.5)

    assert gradcheck(fwd, batch_norm_backward, (x, rm, rv), rng=rng, tol=TOL) < TOL
    np.testing.assert_array_equal(rm, np.zeros(3), strict=True)  # caller's copy untouched


def test_state_argument_restores_closure_state(rng):
    counter = np.zeros(1)

    def fwd(x):
        counter[0] += 1.0  # output depends on how many times forward ran
        return x * counter[0], None

    def bwd(dout, cache):
        return (dout * 1.0,)

    x = rng.standard_normal(4)
    assert gradcheck(fwd, bwd, (x,), rng=rng, state=[counter], tol=TOL) < TOL
    assert counter[0] == 0.0  # restored at the end
    with pytest.raises(GradcheckError):  # without restoring, the drift is caught
        gradcheck(fwd, bwd, (x,), rng=rng, tol=TOL)


def test_wrt_subset_and_report_values(rng):
    x, g, b = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(4)
    err = gradcheck(layer_norm_forward, _ln_backward_scaled_gamma_grad, (x, g, b), rng=rng,
                    wrt=[0, 2], tol=TOL)  # gamma is wrong but not checked
    assert err < TOL


def test_bad_arguments(rng):
    x = rng.standard_normal((2, 3))
    args = (layer_norm_forward, layer_norm_backward, (x, None, None))
    with pytest.raises(ValueError, match="mode"):
        gradcheck(*args, rng=rng, mode="sparse")
    # an empty inputs is named, not left to forward's own TypeError about missing arguments
    for empty in ((), []):
        with pytest.raises(ValueError, match="inputs is empty"):
            gradcheck(layer_norm_forward, layer_norm_backward, empty, rng=rng)
    with pytest.raises(ValueError, match="h"):
        gradcheck(*args, rng=rng, h=0.0)
    with pytest.raises(TypeError, match="rng"):
        gradcheck(*args, rng=np.random.RandomState(0))
    with pytest.raises(TypeError, match="forward must return a tuple"):
        gradcheck(lambda x: x, lambda d, c: (d,), (x,), rng=rng)
    with pytest.raises(ValueError, match="shape"):
        gradcheck(lambda x: (x, None), lambda d, c: (d[:1],), (x,), rng=rng)
    # what backward returns is named, not left to a NumPy conversion error
    with pytest.raises(TypeError, match=r"backward must return a tuple or list.*NoneType"):
        gradcheck(lambda x: (x, None), lambda d, c: None, (x,), rng=rng)
    with pytest.raises(TypeError, match="backward's gradient for input 0 must be a real"):
        gradcheck(lambda x: (x, None), lambda d, c: ([[1.0], [2.0, 3.0]],), (x,), rng=rng)
    with pytest.raises(TypeError, match="backward's gradient for input 0 must have a real"):
        gradcheck(lambda x: (x, None), lambda d, c: (np.full((2, 3), "a"),), (x,), rng=rng)
    with pytest.raises(TypeError, match="input 1 must be a float array"):
        gradcheck(*args, rng=rng, wrt=[1])
    g = np.ones(3)
    with pytest.raises(ValueError, match="no gradient"):
        gradcheck(layer_norm_forward, lambda d, c: (layer_norm_backward(d, c)[0], None),
                  (x, g, None), rng=rng, wrt=[0, 1])


def test_module_and_function_are_both_reachable(rng):
    import importlib
    import types

    import normlab
    import normlab.gradcheck as mod

    assert isinstance(mod, types.ModuleType)
    assert mod is importlib.import_module("normlab.gradcheck")
    assert mod.gradcheck is gradcheck and mod.GradcheckError is GradcheckError
    x, g, b = rng.standard_normal((3, 4)), np.ones(4), np.zeros(4)
    args = (layer_norm_forward, layer_norm_backward, (x, g, b))
    called = normlab.gradcheck(*args, rng=np.random.default_rng(5))  # the module, called
    direct = gradcheck(*args, rng=np.random.default_rng(5))
    assert called == direct < TOL


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"forward": None}, TypeError, "forward must be callable"),
    ({"backward": None}, TypeError, "backward must be callable"),
    ({"inputs": None}, TypeError, "inputs must be a tuple or list"),
    ({"inputs": np.ones((2, 3))}, TypeError, r"wrap a single array as \(x,\)"),
    ({"wrt": [3]}, ValueError, "wrt entry must be < 3"),
    ({"wrt": [0.0]}, TypeError, "wrt entry must be an integer"),
    ({"tol": -1.0}, ValueError, "tol"),
    ({"names": ["x"]}, ValueError, "names must be a sequence of 3"),
    ({"state": [[1.0]]}, TypeError, r"state\[0\] must be a numpy ndarray"),
])
def test_arguments_are_checked_before_the_generator_moves(kwargs, exc, match):
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    args = {"forward": layer_norm_forward, "backward": layer_norm_backward,
            "inputs": (np.ones((2, 3)), np.ones(3), np.zeros(3))} | kwargs
    with pytest.raises(exc, match=match):
        gradcheck(args.pop("forward"), args.pop("backward"), args.pop("inputs"), rng=rng,
                  **args)
    assert rng.bit_generator.state == before
