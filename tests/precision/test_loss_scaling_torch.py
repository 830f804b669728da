"""DynamicLossScaler against torch.amp.GradScaler driven on CPU (same scripted overflows)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision.training.loss_scaling import DynamicLossScaler  # noqa: E402


@pytest.mark.parametrize(
    ("init", "gf", "bf", "gi"),
    [(2.0**16, 2.0, 0.5, 3), (3.0, 1.7, 0.37, 2), (1e30, 10.0, 0.9, 1), (2.0**120, 4.0, 0.5, 1)],
)
def test_trace_matches_gradscaler(init: float, gf: float, bf: float, gi: int) -> None:
    rng = np.random.default_rng(0)
    ref = torch.amp.GradScaler("cpu", init_scale=init, growth_factor=gf,
                               backoff_factor=bf, growth_interval=gi)
    mine = DynamicLossScaler(init, gf, bf, gi)
    p = torch.nn.Parameter(torch.zeros(5))
    opt = torch.optim.SGD([p], lr=0.0)
    for _ in range(40):
        vals = (rng.standard_normal(5) * 1e3).astype(np.float32)
        if rng.random() < 0.3:
            vals[rng.integers(5)] = rng.choice([np.inf, -np.inf, np.nan])
        ref.scale(torch.ones(()))
        p.grad = torch.from_numpy(vals.copy())
        ref.step(opt)
        ref.update()
        g = vals.copy()
        found = mine.unscale([g])
        mine.update(found)
        # exact: both apply one float32 multiply by the same float32 reciprocal
        np.testing.assert_array_equal(g, p.grad.numpy())
        assert mine.scale == ref.get_scale()  # exact: same float32 arithmetic
        assert mine.state_dict()["_growth_tracker"] == ref._get_growth_tracker()
    sd = ref.state_dict()
    other = DynamicLossScaler()
    other.load_state_dict(sd)
    assert other.scale == mine.scale


def test_update_new_scale_trace_matches_gradscaler() -> None:
    """update(new_scale=...) as GradScaler.update(new_scale): float or 1-element array,
    rounded to float32, growth tracker kept, recorded overflows dropped."""
    rng = np.random.default_rng(3)
    ref = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=3)
    mine = DynamicLossScaler(1024.0, 2.0, 0.5, 3)
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.0)
    for t in range(36):
        vals = (rng.standard_normal(4) * 100).astype(np.float32)
        if rng.random() < 0.3:
            vals[0] = np.inf
        ref.scale(torch.ones(()))
        p.grad = torch.from_numpy(vals.copy())
        ref.step(opt)
        g = vals.copy()
        mine.unscale([g])
        new = float(rng.uniform(1.0, 5000.0))  # not a float32 value: rounding is tested
        if t % 5 == 1:
            ref.update(new)
            mine.update(new_scale=new)
        elif t % 5 == 3:
            ref.update(torch.tensor(new, dtype=torch.float64))  # 0-d: torch copies it
            mine.update(new_scale=np.array([new]))
        else:
            ref.update()
            mine.update()
        np.testing.assert_array_equal(g, p.grad.numpy())
        assert mine.scale == ref.get_scale()
        assert mine.state_dict()["_growth_tracker"] == ref._get_growth_tracker()


@pytest.mark.parametrize("init", [0.1, 2.0**16, 3.0])
def test_load_gradscaler_state_dicts(init: float) -> None:
    """Every GradScaler state dict loads: before the first scale() (init_scale as given,
    not yet float32) and after a backoff to 0.0."""
    ref = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=4)
    mine = DynamicLossScaler()
    mine.load_state_dict(ref.state_dict())
    assert mine.scale == float(np.float32(init))
    ref.scale(torch.ones(()))
    ref.update(0.0)  # a scale that underflowed to zero, which torch saves and loads
    sd = ref.state_dict()
    assert sd["scale"] == 0.0
    mine.load_state_dict(sd)
    assert mine.scale == 0.0 and mine.inv_scale == float("inf")
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict({k: mine.state_dict()[k] for k in sd})
    assert back.state_dict() == sd
