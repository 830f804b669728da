"""SGD and AdamW against torch.optim on CPU (same gradients, 25 steps)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.nn.optim import SGD, AdamW  # noqa: E402

CONFIGS = [
    (SGD, {"lr": 0.05}),
    (SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    (SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    (AdamW, {}),
    (AdamW, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
]


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_torch_optim(cls: type, kwargs: dict, dtype: type) -> None:
    rng = np.random.default_rng(1)
    w0 = [rng.standard_normal((4, 3)).astype(dtype), rng.standard_normal(7).astype(dtype)]
    mine = [SimpleNamespace(data=w.copy(), grad=None) for w in w0]
    ref = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in w0]
    opt = cls(mine, **kwargs)
    ref_opt = getattr(torch.optim, cls.__name__)(ref, **kwargs)
    for _ in range(25):
        for m, r in zip(mine, ref, strict=True):
            g = rng.standard_normal(m.data.shape).astype(dtype)
            m.grad = g
            r.grad = torch.from_numpy(g.copy())
        opt.step()
        ref_opt.step()
    # tolerance: torch's vectorised CPU kernels fuse a + alpha*b into an FMA, so each step
    # may differ by ~1 ulp; 25 steps on O(1) weights stay well inside 2e-6 (float32) or
    # 1e-13 (float64) relative.
    tol = 2e-6 if dtype == np.float32 else 1e-13
    for m, r in zip(mine, ref, strict=True):
        np.testing.assert_allclose(m.data, r.detach().numpy(), rtol=tol, atol=tol)


def test_clip_grad_norm_matches_torch() -> None:
    from normlab.precision.training.mixed_step import clip_grad_norm

    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(s).astype(np.float32) * 3 for s in ((5, 4), (7,), (2, 3))]
    ref = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    for r, g in zip(ref, grads, strict=True):
        r.grad = torch.from_numpy(g.copy())
    total_ref = float(torch.nn.utils.clip_grad_norm_(ref, max_norm=1.5))
    mine = [g.copy() for g in grads]
    total = clip_grad_norm(mine, 1.5)
    # torch reduces in float32, we in float64: totals agree to float32 rounding (1e-6)
    assert total == pytest.approx(total_ref, rel=1e-6)
    for m, r in zip(mine, ref, strict=True):
        np.testing.assert_allclose(m, r.grad.numpy(), rtol=1e-6)
