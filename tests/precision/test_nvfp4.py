"""NVFP4: hand-derived blocks, an independent per-block oracle (ml_dtypes casts), properties.

The oracle re-states the recipe block by block in float32 with ml_dtypes' float8_e4m3fn
and float4_e2m1fn casts (round to nearest even; E4M3 saturation by clipping first, E2M1
always saturates in ml_dtypes), sharing no code with normlab's rounding. Comparisons are
exact. Error comparisons use Gaussian data, where the claims hold by wide margins.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import (
    mx_quantize,
    nvfp4_quantize,
    quantize,
    stochastic_words,
)

F32 = np.float32


def _oracle(x, axis=-1, two_d=False):
    """(elements, block_scales, tensor_scale) by the formulas, one block at a time."""
    x = np.moveaxis(np.asarray(x, np.float32), axis, -1)
    amax_t = F32(np.max(np.abs(x)))
    s_enc = F32(F32(2688.0) / amax_t) if amax_t > 0 else F32(1.0)
    s_dec = F32(F32(1.0) / s_enc)
    el = np.zeros_like(x)
    rows, cols = x.shape[-2] if two_d else 1, x.shape[-1]
    flat = x.reshape(-1, rows, cols)
    out = el.reshape(-1, rows, cols)
    r = 16 if two_d else 1
    scales = np.zeros((flat.shape[0], -(-rows // r), -(-cols // 16)), np.float32)
    for a in range(flat.shape[0]):
        for i in range(0, rows, r):
            for j in range(0, cols, 16):
                blk = flat[a, i:i + r, j:j + 16]
                sb = F32(F32(F32(np.max(np.abs(blk))) * F32(1 / 6)) * s_enc)
                sb = F32(np.array(min(sb, F32(448)), F32).astype(ml_dtypes.float8_e4m3fn))
                scales[a, i // r, j // 16] = sb
                inv = F32(1.0) / F32(sb * s_dec) if sb > 0 else np.finfo(F32).max
                q = (blk * F32(inv)).astype(F32).astype(ml_dtypes.float4_e2m1fn)
                out[a, i:i + r, j:j + 16] = q.astype(F32)
    el = np.moveaxis(out.reshape(x.shape), -1, axis)
    lead = x.shape[:-2] if two_d else x.shape[:-1]
    scales = scales.reshape(*lead, *scales.shape[1:]) if two_d else np.moveaxis(
        scales.reshape(*lead, scales.shape[-1]), -1, axis)
    return el, scales, float(s_dec)


def test_worked_example_by_hand():
    # amax 7.5: S_enc = 2688 / 7.5 = 358.4; block scale e4m3(7.5 / 6 * 358.4 = 448) = 448;
    # e_b = 1 / (448 / 358.4) = 0.8; x * 0.8 = 0, .4, .8, ..., 6 rounded on 0 .5 1 1.5 2 3 4 6
    x = np.arange(16, dtype=np.float32) / 2
    t = nvfp4_quantize(x)
    assert t.block_scales.tolist() == [448.0]
    assert t.elements.tolist() == [0, .5, 1, 1, 1.5, 2, 2, 3, 3, 4, 4, 4, 4, 6, 6, 6]
    assert t.tensor_scale == float(F32(1) / F32(F32(2688) / F32(7.5)))
    # a second block with amax 0.75: 0.75 / 6 * 358.4 = 44.8 -> E4M3 (quantum 4 in [32, 64))
    # rounds to 44; that block dequantises with 44 / 358.4 per unit
    y = np.concatenate([x, x / 10])
    t2 = nvfp4_quantize(y)
    assert t2.block_scales.tolist() == [448.0, 44.0]


@pytest.mark.parametrize(("shape", "axis", "two_d"), [
    ((4, 64), -1, False), ((40, 3), 0, False), ((2, 3, 37), -1, False),
    ((48, 32), -1, True), ((2, 20, 40), -1, True),
])
def test_matches_the_per_block_oracle(shape, axis, two_d, rng):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    t = nvfp4_quantize(x, axis=axis, block_shape=(16, 16) if two_d else None)
    el, sc, s_dec = _oracle(x, axis, two_d)
    np.testing.assert_array_equal(t.elements, el)
    np.testing.assert_array_equal(t.block_scales, sc)
    assert t.tensor_scale == s_dec
    want = el * np.moveaxis(np.repeat(np.moveaxis(sc, axis, -1), 16, -1)[..., :shape[axis]],
                            -1, axis) if not two_d else None
    if want is not None:  # q * s_b is exact, then one float32 product with S_dec
        np.testing.assert_array_equal(t.dequantize(), (want * F32(s_dec)).astype(F32))


def test_two_d_blocks_give_the_transpose_the_same_numbers(rng):
    w = rng.standard_normal((32, 48)).astype(np.float32)
    a = nvfp4_quantize(w, block_shape=(16, 16))
    b = nvfp4_quantize(w.T.copy(), block_shape=(16, 16))
    np.testing.assert_array_equal(a.elements, b.elements.T)
    np.testing.assert_array_equal(a.block_scales, b.block_scales.T)


def test_stochastic_elements_use_the_seed_scheme(rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    a = nvfp4_quantize(x, rounding="stochastic", seed=11)
    b = nvfp4_quantize(x, rounding="stochastic", random_bits=stochastic_words(11, x.shape))
    np.testing.assert_array_equal(a.elements, b.elements)
    near = nvfp4_quantize(x)
    # each element is one of the two E2M1 neighbours of x * e_b: the scaled value is
    # recovered exactly from the nearest result's scales (same scales in both modes)
    np.testing.assert_array_equal(a.block_scales, near.block_scales)
    e_b = np.repeat(F32(1) / (near.block_scales * F32(near.tensor_scale)), 16, -1)
    scaled = x * e_b
    lo = quantize(scaled, "fp4", rounding="toward_negative")
    hi = quantize(scaled, "fp4", rounding="toward_positive")
    assert ((a.elements == lo) | (a.elements == hi)).all() and (a.elements != near.elements).any()


def test_stochastic_rounding_is_unbiased_on_average():
    # 20000 copies of one block (same scales: one E2M1 unit is 448 / 358.4 = 1.25 in x's
    # units, steps of at most 2 units = 2.5); each copy draws its own words. A rounding
    # error is a two-point variable spanning one step: sd <= 2.5 / 2, so the mean of 20000
    # has sd <= 1.25 / 141 = 0.0088; checked at 5 sd (0.045), while nearest rounding is
    # off by 0.5 at x = 5.5 (x * 0.8 = 4.4 -> 4 -> 5.0).
    x = np.linspace(-7.5, 7.5, 16, dtype=np.float32)
    t = nvfp4_quantize(np.tile(x, (20000, 1)), rounding="stochastic", seed=2026)
    assert (t.block_scales == 448.0).all()
    assert np.abs(t.dequantize().mean(axis=0) - x).max() < 0.045
    assert np.abs(nvfp4_quantize(x).dequantize() - x).max() >= 0.5


def test_two_level_error_below_single_level_e8m0(rng):
    # NVFP4 (E4M3 block scales + a tensor scale) against E2M1 with power-of-two E8M0 block
    # scales (MXFP4, blocks of 32 and of 16): the finer block scales map each block's amax
    # near 6 instead of losing up to a factor 2 of range
    x = rng.standard_normal((256, 256)).astype(np.float32)
    err = {"nvfp4": np.mean((nvfp4_quantize(x).dequantize() - x) ** 2)}
    for k in (16, 32):
        err[f"mxfp4-{k}"] = np.mean((mx_quantize(x, "fp4", block_size=k).dequantize() - x) ** 2)
    assert err["nvfp4"] < 0.8 * min(err["mxfp4-16"], err["mxfp4-32"]), err


def test_specials_and_tensor_amax():
    z = nvfp4_quantize(np.zeros(32, np.float32))
    assert z.tensor_scale == 1.0 and not z.elements.any() and not z.block_scales.any()
    x = np.arange(32, dtype=np.float32)
    x[3] = np.nan
    with np.errstate(invalid="ignore"):
        t = nvfp4_quantize(x, tensor_amax=31.0)
    assert np.isnan(t.elements[:16]).all() and np.isnan(t.block_scales[0])
    assert t.block_scales[1] == 448.0 and not np.isnan(t.elements[16:]).any()
    # a given tensor amax replaces max |x|: S_enc = 2688 / 62 halves the block scales
    assert nvfp4_quantize(np.arange(16.0), tensor_amax=30.0).block_scales[0] == 224.0


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"block_shape": (16, 16), "axis": 0}, ValueError, "block_shape"),
    ({"block_shape": (16,)}, ValueError, "block_shape"),
    ({"rounding": "toward_zero"}, ValueError, "rounding"),
    ({"tensor_amax": -1.0}, ValueError, "tensor_amax"),
    ({"rounding": "stochastic"}, ValueError, "exactly one source"),
    ({"axis": 2}, ValueError, "axis"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        nvfp4_quantize(np.ones((16, 16), np.float32), **kwargs)
    with pytest.raises(TypeError, match="x must"):
        nvfp4_quantize(np.ones(16, np.int32))


def test_block_scale_follows_te_operation_order() -> None:
    # TE (core_nvfp4.cuh, compute_decoding_scaling_factor) rounds S_enc * (1/6) to float32
    # first, then multiplies by the block amax. For these two float32 values that product is
    # exactly 1.0625, the tie between the E4M3 codes 1.0 and 1.125 (ties to even: 1.0), while
    # the other association, (amax_b * (1/6)) * S_enc, lands one ulp above the tie (-> 1.125).
    f = np.float32
    amax_t, amax_b = f(18.38990592956543), f(0.043614454567432404)
    s_enc = f(f(2688.0) / amax_t)
    assert f(amax_b * f(s_enc * f(1.0 / 6.0))) == f(1.0625)
    assert f(f(amax_b * f(1.0 / 6.0)) * s_enc) > f(1.0625)
    x = np.zeros(16, np.float32)
    x[3] = amax_b
    t = nvfp4_quantize(x, tensor_amax=float(amax_t))
    np.testing.assert_array_equal(t.block_scales, np.array([1.0], np.float32), strict=True)
