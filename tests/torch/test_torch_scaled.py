"""Scaled recipes on tensors equal their NumPy twins bit for bit: current scaling,
fp8_quantize, delayed scaling (fused and unfused updates), MX (both scale rules)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab import precision
from normlab.precision import DelayedScaling


def _same(t: torch.Tensor, a: np.ndarray) -> bool:
    got = t.cpu().numpy()
    ut = {4: np.uint32, 8: np.uint64, 1: np.uint8}[got.dtype.itemsize]
    return got.shape == a.shape and np.array_equal(got.view(ut), np.asarray(a, got.dtype).view(ut))


def _data(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, size=shape))
    flat = x.reshape(-1)
    flat[:5] = [0.0, -0.0, 3e38, -7e-39, 1e-45]  # zero, huge, float32 subnormals
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("margin", "eps", "pow2"), [(0, 0.0, False), (2, 1e-3, True),
                                                     (-1, 0.0, True)])
def test_current_scaling_matches_numpy(rng, dtype, margin, eps, pow2):
    x = _data(rng, dtype, (64, 48)) * dtype(1e-37)  # amax near float32's bottom too
    for arr in (x, x * dtype(1e37), np.zeros((3, 4), dtype)):
        for fmt in ("e4m3", "e5m2"):
            want = precision.quantize_current_scaling(arr, fmt, margin=margin,
                                                      amax_epsilon=eps, power_of_2_scales=pow2)
            got = nt.quantize_current_scaling(torch.from_numpy(arr), fmt, margin=margin,
                                              amax_epsilon=eps, power_of_2_scales=pow2)
            assert _same(got.data, want.data)
            assert got.scale.item() == want.scale and got.scale_inv.item() == want.scale_inv
            assert got.amax.item() == want.amax
            assert _same(got.dequantize(), want.dequantize())


def test_fp8_quantize_nan_and_errors():
    x = np.array([1.0, np.nan, -np.inf, 500.0], np.float32)
    want = precision.fp8_quantize(x, "e4m3", 3.0)
    got = nt.fp8_quantize(torch.from_numpy(x), "e4m3", 3.0)
    assert _same(got.data, want.data) and np.isnan(got.amax.item())
    with pytest.raises(ValueError, match="scale"):
        nt.fp8_quantize(torch.ones(2), "e4m3", 0.0)
    with pytest.raises(ValueError, match="amax_epsilon"):
        nt.quantize_current_scaling(torch.ones(2), amax_epsilon=-1.0)


@pytest.mark.parametrize("update", ["fused", "unfused"])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_follows_numpy_step_by_step(rng, update, algo):
    recipe = DelayedScaling(margin=1, amax_history_len=4, amax_compute_algo=algo,
                            update=update)
    ref = precision.Fp8Meta(recipe, role="backward")
    meta = nt.Fp8Meta(recipe, role="backward")
    # steps with growing, zero (no roll in the fused update), NaN and tiny amaxes
    factors = [1.0, 30.0, 0.0, 2.0, np.nan, 0.5, 1e-30, 4.0, 0.0, 1.0]
    for step, f in enumerate(factors):
        for _ in range(2):  # two quantisations a step: slot 0 is a running max
            x = (rng.standard_normal(50) * f).astype(np.float32)
            if step == 3:
                x[0] = np.inf
            want = ref.quantize(x)
            got = meta.quantize(torch.from_numpy(x))
            assert _same(got.data, want.data), step
        ref.update()
        meta.update()
        assert _same(meta.amax_history, ref.amax_history), step
        assert meta.scale.item() == ref.scale and meta.scale_inv.item() == ref.scale_inv


@pytest.mark.parametrize("rule", ["ocp", "round_up"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "fp6_e3m2", "fp6_e2m3", "fp4", "int8"])
def test_mx_matches_numpy(rng, rule, elem):
    x = _data(rng, np.float32, (6, 96))
    x[1, 32:64] = 0.0  # an all-zero block
    x[2, 5] = np.nan  # a NaN block
    x[3, 70] = -np.inf  # an infinite block
    x[4, :32] *= np.float32(2.0**100)  # scales near the top of E8M0
    # blocks whose round-up product amax / elem_max is a float32 subnormal just below,
    # at and above 2^-127 (the bottom of E8M0, where the rounding rule has a special case)
    top = precision.mx_quantize(np.ones(1), elem, block_size=1).elem_format.max
    for j, f in enumerate((0.8, 1.0, 1.3)):
        x[5, 32 * j: 32 * j + 32] = np.float32(top * 2.0**-127 * f) * np.linspace(
            0.1, 1.0, 32, dtype=np.float32)
    for arr, axis, pad, k in ((x, -1, False, 32), (x.astype(np.float64), 0, True, 4),
                              (x[:, :90], 1, True, 32)):
        want = precision.mx_quantize(arr, elem, block_size=k, axis=axis, scale_rule=rule,
                                     pad=pad)
        got = nt.mx_quantize(torch.from_numpy(np.ascontiguousarray(arr)), elem, block_size=k,
                             axis=axis, scale_rule=rule, pad=pad)
        assert _same(got.scale_codes, want.scale_codes)
        assert _same(got.elements, want.elements)
        with np.errstate(over="ignore", invalid="ignore"):
            assert _same(got.dequantize(), want.dequantize())
        assert _same(got.scales, want.scales)


def test_mx_errors():
    with pytest.raises(ValueError, match="block_size"):
        nt.mx_quantize(torch.ones(5, 33), "e4m3")
    with pytest.raises(ValueError, match="scale_rule"):
        nt.mx_quantize(torch.ones(32), "e4m3", scale_rule="nearest")
    with pytest.raises(ValueError, match="axis"):
        nt.mx_quantize(torch.ones(32), "e4m3", axis=2)
