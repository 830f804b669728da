"""Experiment residual_depth: quick run, and the measurement's own assumptions checked.

The criteria are tested for failing in tests/lab/test_breaks_residual_depth.py; here the
method: prefix stacks equal fresh stacks, the perturbation is in the linear regime, DeepNorm
stacks carry DeepNet's constants, and Adam's first step moves every weight by about lr.
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab._backend import use_backend
from normlab.lab.experiments import _residual_models as models
from normlab.lab.experiments import residual_depth as exp
from normlab.lab.result import NullProgress, Settings


@pytest.fixture(autouse=True)
def _reference_backend():
    with use_backend("numpy"):
        yield


def _stack(placement: str, depth: int, seed: int = 3):
    return exp._setup(placement, depth, seed, 2)


def test_quick_run_reports_every_check_and_the_figure():
    result = exp.run(Settings("quick", 0), NullProgress())
    assert len(result.checks) == 5
    assert set(result.figures) == {"depth"}
    assert result.settings["depths"] == list(exp.QUICK_DEPTHS)
    # the perturbation claims hold at the quick size for seed 0 (slopes 1.10, 0.53, 0.55);
    # the fault-injection test relies on Post-LN's O(N) and Pre-LN's O(log N) passing here
    passed = {c.claim.split(":")[0]: c.passed for c in result.checks}
    assert [c.passed for c in result.checks[2:]] == [True, True, True], passed


@pytest.mark.parametrize("placement", ["post", "admin", "pre"])
def test_the_first_layers_of_a_deep_stack_are_a_shallow_stack(placement):
    # the perturbation reads depth N off the deepest stack; that is only sound if its first
    # N layers compute exactly what an N-layer stack computes (Admin's omega included)
    _, x, deep = _stack(placement, 4)
    _, _, shallow = _stack(placement, 2)
    (y_prefix,) = exp._outputs_by_depth(deep, x, (2,))
    np.testing.assert_array_equal(y_prefix, models.stack_output(shallow, x))


def test_perturbation_is_in_the_linear_regime(monkeypatch):
    # E||ΔF||² must scale as SIGMA²: doubling SIGMA multiplies it by 4 (to 2%, the second
    # order term being ~SIGMA relative)
    small = exp.output_change("post", (3,), 5, 2)[0]
    monkeypatch.setattr(exp, "SIGMA", 2 * exp.SIGMA)
    large = exp.output_change("post", (3,), 5, 2)[0]
    np.testing.assert_allclose(large / small, 4.0, rtol=0.02)


def test_deepnorm_stack_uses_deepnets_constants():
    _, _, stack = _stack("deepnorm", 8)
    alpha, beta = (2 * 8) ** 0.25, (8 * 8) ** -0.25  # DeepNet, decoder-only, N = 8
    res = list(stack.blocks)
    assert len(res) == 16 and all(r.deepnorm_alpha == pytest.approx(alpha) for r in res)
    attn, mlp = res[0].sublayer, res[1].sublayer
    # Xavier-normal std for a (fan_out, fan_in) matrix is sqrt(2 / (fan_in + fan_out))
    for w, fan, scale in ((attn.query.weight, (64, 64), 1.0), (attn.value.weight, (64, 64), beta),
                          (mlp.fc1.weight, (64, 128), beta)):  # fmt: skip
        expected = scale * np.sqrt(2.0 / sum(fan))
        # std of 4096-8192 Gaussian draws: relative standard error below 1.2%; 5% band
        np.testing.assert_allclose(w.data.std(), expected, rtol=0.05)


def test_adam_first_step_moves_every_weight_by_about_lr(monkeypatch):
    moved = []
    real = exp.AdamW

    def spy(params, **kw):
        opt = real(params, **kw)
        before = [p.data.copy() for p in params]
        step = opt.step

        def wrapped():
            step()
            moved.extend(np.abs(p.data - b).ravel() for p, b in zip(params, before, strict=True))

        opt.step = wrapped
        return opt

    monkeypatch.setattr(exp, "AdamW", spy)
    exp.update_size("post", 2, 0, 2)
    steps = np.concatenate(moved)
    # m/sqrt(v) = g/|g| on the first step: every weight with |g| >> eps = 1e-8 moves by lr
    assert np.mean(np.abs(steps - exp.LR) < 1e-3 * exp.LR) > 0.99
