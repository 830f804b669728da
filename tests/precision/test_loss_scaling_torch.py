"""DynamicLossScaler against torch.amp.GradScaler driven on CPU (same scripted overflows)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision.loss_scaling import DynamicLossScaler  # noqa: E402


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
