"""normlab.torch.training.optim.AdamW against the NumPy LowPrecisionUpdater, bit for bit.

The NumPy side computes the AdamW delta independently (float32 NumPy arithmetic, every
operation correctly rounded, so the same bits as torch's separate elementwise kernels) and
hands it to ``LowPrecisionUpdater.apply``; the torch side steps bf16/fp16 parameters in
place. Same initial weights, gradients and generator seed: the parameters must agree
exactly (tolerance 0) after every step, in every rounding mode.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import LowPrecisionUpdater, quantize  # noqa: E402
from normlab.torch.training.optim import AdamW  # noqa: E402

LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1


def _numpy_adamw_deltas(w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray,
                        t: int) -> np.ndarray:
    """The AdamW update in float32 NumPy (moments updated in place)."""
    f = np.float32
    b1, b2 = BETAS
    m += (g - m) * f(1.0 - b1)
    v *= f(b2)
    v += (g * f(1.0 - b2)) * g
    denom = np.sqrt(v) / f(math.sqrt(1.0 - b2**t)) + f(EPS)
    return (m * f(-LR / (1.0 - b1**t))) / denom - w * f(LR * WD)


@pytest.mark.parametrize("mode", ["nearest", "stochastic", "kahan"])
@pytest.mark.parametrize(("dtype", "fmt"), [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_matches_numpy_updater(mode: str, dtype: torch.dtype, fmt: str) -> None:
    rng = np.random.default_rng(5)
    shapes = [(16, 8), (8,)]
    w0 = [quantize(rng.standard_normal(s).astype(np.float32), fmt) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes]
             for _ in range(6)]
    params = [torch.nn.Parameter(torch.from_numpy(w.copy()).to(dtype)) for w in w0]
    opt = AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, param_rounding=mode,
                rng=np.random.default_rng(11) if mode == "stochastic" else None)
    up = LowPrecisionUpdater(fmt, mode, np.random.default_rng(11) if mode == "stochastic"
                             else None)
    ws = [w.copy() for w in w0]
    ms = [np.zeros(s, np.float32) for s in shapes]
    vs = [np.zeros(s, np.float32) for s in shapes]
    for t, step_grads in enumerate(grads, start=1):
        for p, g in zip(params, step_grads, strict=True):
            p.grad = torch.from_numpy(g).to(dtype)
        opt.step()
        for w, g, m, v in zip(ws, step_grads, ms, vs, strict=True):
            g_rounded = quantize(g, fmt)  # the gradient as the low-precision .grad holds it
            up.apply(w, _numpy_adamw_deltas(w, g_rounded, m, v, t))
        for p, w in zip(params, ws, strict=True):
            np.testing.assert_array_equal(p.detach().float().numpy(), w, strict=True)


@pytest.mark.parametrize("mode", ["stochastic", "kahan"])
def test_small_updates_accumulate_where_nearest_stalls(mode: str) -> None:
    # each step moves w by about lr = 2^-10, below half of bf16's ulp at 1.0 (2^-7 / 2):
    # nearest rounds every update away; kahan and stochastic keep the sum, E[w] = 1 + 64 *
    # 2^-10 = 1.0625 after 64 steps. Stochastic: each rounding adds variance <= ulp^2 / 4,
    # so one element's sd <= 2^-7 * sqrt(64) / 2 = 2^-5 and the mean of 256 has sd <= 2^-9;
    # the bound below is 4 sd.
    results = {}
    for m in ("nearest", mode):
        w = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
        opt = AdamW([w], lr=2.0**-10, weight_decay=0.0, param_rounding=m, seed=3)
        for _ in range(64):
            w.grad = -torch.ones_like(w)  # Adam's normalised step: lr (1 - O(eps))
            opt.step()
        results[m] = float(w.detach().float().mean())
    assert results["nearest"] == 1.0
    assert abs(results[mode] - 1.0625) < 4 * 2.0**-9


def test_validation() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="param_rounding"):
        AdamW([w], param_rounding="up")
    with pytest.raises(TypeError, match="parameters must be"):
        AdamW([torch.nn.Parameter(torch.ones(2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="betas"):
        AdamW([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        AdamW([w], lr=-1.0)


def _params_and_grads(dtype: torch.dtype, steps: int) -> tuple[list, list]:
    rng = np.random.default_rng(7)
    shapes = [(16, 8), (8,)]
    w0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[torch.from_numpy(rng.standard_normal(s).astype(np.float32) * 0.01).to(dtype)
              for s in shapes] for _ in range(steps)]
    return [torch.from_numpy(w).to(dtype) for w in w0], grads


def _run(params: list, opt: AdamW, grads: list) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("mode", ["nearest", "stochastic", "kahan"])
def test_resume_is_bit_identical_and_state_stays_float32(mode: str) -> None:
    # N steps in one go against k steps, save (through torch.save), a new optimizer with
    # another seed, load, N - k steps: parameters and state agree exactly (tolerance 0)
    n, k, dtype = 6, 3, torch.bfloat16
    w0, grads = _params_and_grads(dtype, n)
    kw = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD, "param_rounding": mode}
    full = [torch.nn.Parameter(w.clone()) for w in w0]
    opt = AdamW(full, **kw, seed=11)
    _run(full, opt, grads)

    part = [torch.nn.Parameter(w.clone()) for w in w0]
    first = AdamW(part, **kw, seed=11)
    _run(part, first, grads[:k])
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = AdamW(part, **kw, seed=99)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    for p in part:
        for key, value in resumed.state[p].items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == torch.float32, key
    _run(part, resumed, grads[k:])
    for a, b in zip(full, part, strict=True):
        assert torch.equal(a, b)
        for key, value in opt.state[a].items():
            other = resumed.state[b][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) \
                else value == other, key


def test_load_state_dict_rejects_a_foreign_or_mismatched_state() -> None:
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = AdamW([w], param_rounding="stochastic", seed=1)
    w.grad = torch.ones_like(w)
    opt.step()
    state = opt.state_dict()
    other = AdamW([torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))],
                  param_rounding="nearest")
    with pytest.raises(ValueError, match="param_rounding"):
        other.load_state_dict(state)
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.ones(4))]).state_dict()
    with pytest.raises(ValueError, match="not saved by"):
        opt.load_state_dict(plain)
    bad = {**state, "normlab": {**state["normlab"], "rng": {"bit_generator": "nope"}}}
    with pytest.raises(ValueError, match="generator state"):
        opt.load_state_dict(bad)
    shaped = {**state, "state": {0: {**state["state"][0], "exp_avg": torch.zeros(5)}}}
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(shaped)
    assert opt.state[w]["exp_avg"].shape == (4,)  # nothing changed
