"""MX block quantisation: examples worked by hand for both scale rules, special blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab.precision.scaled.mx import e8m0_scales, mx_dequantize, mx_quantize


def _block(head: list[float], k: int = 32) -> np.ndarray:
    return np.array(head + [0.0] * (k - len(head)), dtype=np.float32)


def test_fp4_example() -> None:
    # amax 6.5: floor(log2 6.5) = 2, E2M1 emax = 2 -> e = 0 (code 127). Elements: 0.3 -> 0.5
    # (grid 0, .5, 1, 1.5, 2, 3, 4, 6), -6.5 saturates to -6.
    t = mx_quantize(np.array([1.0, 3.0, 0.3, -6.5]), "fp4", block_size=4)
    assert t.scale_codes.tolist() == [127]
    assert t.elements.tolist() == [1.0, 3.0, 0.5, -6.0]
    # E2M1 codes (sign, 2 exponent bits, 1 mantissa bit): 1.0 = 0b0010, 3.0 = 0b0101,
    # 0.5 = 0b0001 (subnormal), -6.0 = 0b1111
    assert t.element_codes().tolist() == [0b0010, 0b0101, 0b0001, 0b1111]


def test_e4m3_ocp_clips_where_round_up_does_not() -> None:
    x = _block([500.0, 1.0, -3.0])
    ocp = mx_quantize(x, "e4m3")
    # floor(log2 500) = 8 = emax(E4M3) -> e = 0; 500 saturates to 448
    assert ocp.scale_codes.tolist() == [127]
    assert ocp.elements[:3].tolist() == [448.0, 1.0, -3.0]
    up = mx_quantize(x, "e4m3", scale_rule="round_up")
    # smallest 2^e with 500 / 2^e <= 448 is 2 -> code 128; 250 -> 256 (spacing 16 in
    # [128, 256), 250 is nearer 256), 0.5 and -1.5 exact
    assert up.scale_codes.tolist() == [128]
    assert up.elements[:3].tolist() == [256.0, 0.5, -1.5]
    assert up.dequantize()[:3].tolist() == [512.0, 1.0, -3.0]


@pytest.mark.parametrize(
    ("fmt", "amax", "ocp_code", "up_code"),
    [
        ("e4m3", 448.0, 127, 127),  # exactly max: both rules give 2^0
        ("e4m3", 460.0, 127, 128),
        ("e4m3", 1.0, 119, 119),  # ocp 0 - 8; up: 2^-9 < 1/448 <= 2^-8 -> code 119
        ("e5m2", 2.0**20, 132, 132),  # 20 - 15 = 5; 2^20 / 57344 = 18.3 -> 2^5
        ("fp6_e3m2", 32.0, 128, 128),  # emax 4: 5 - 4 = 1; 32 / 28 -> 2^1
        ("fp6_e2m3", 7.5, 127, 127),  # emax 2: 2 - 2 = 0
        ("fp6_e2m3", 8.0, 128, 128),
    ],
)
def test_scale_codes_by_hand(fmt: str, amax: float, ocp_code: int, up_code: int) -> None:
    x = _block([amax, -amax / 8])
    assert mx_quantize(x, fmt).scale_codes.tolist() == [ocp_code]
    assert mx_quantize(x, fmt, scale_rule="round_up").scale_codes.tolist() == [up_code]


def test_round_up_is_the_exact_ceiling_for_normal_amax() -> None:
    # Oracle: smallest integer e with amax <= elem_max * 2^e, found with exact float64
    # comparisons (elem_max * 2^e is exact).
    rng = np.random.default_rng(3)
    amax = (2.0 ** rng.uniform(-100, 100, 400)).astype(np.float32)
    for fmt, emax_val in (("e4m3", 448.0), ("e5m2", 57344.0), ("fp4", 6.0), ("fp6_e2m3", 7.5)):
        x = np.zeros((400, 32), np.float32)
        x[:, 5] = amax
        codes = mx_quantize(x, fmt, scale_rule="round_up").scale_codes[:, 0].astype(int)
        for a, c in zip(amax.tolist(), codes.tolist(), strict=True):
            e = math.ceil(math.log2(a / emax_val))
            while a > emax_val * 2.0**e:
                e += 1
            while a <= emax_val * 2.0 ** (e - 1):
                e -= 1
            assert c == e + 127, (fmt, a)


def test_exact_roundtrip_of_representable_block() -> None:
    vals = np.array([448.0, 1.5, -2.0**-6, 0.0, -416.0]) * 2.0**-10
    t = mx_quantize(_block(vals.tolist()), "e4m3")
    assert t.scale_codes.tolist() == [117]  # floor(log2(448 * 2^-10)) = -2; -2 - 8 = -10
    np.testing.assert_array_equal(t.dequantize()[:5], vals.astype(np.float32))  # exact


def test_special_blocks() -> None:
    x = np.stack([_block([0.0]), _block([1.0, np.nan]), _block([2.0, np.inf])])
    ocp = mx_quantize(x, "e4m3")
    assert ocp.scale_codes[:, 0].tolist() == [0, 255, 255]
    assert np.all(ocp.elements[0] == 0) and np.all(np.isnan(ocp.elements[1:]))
    assert np.all(np.isnan(ocp.dequantize()[1:]))
    assert np.all(ocp.element_codes()[1:] == 0)  # NaN blocks store code 0 under a NaN scale
    up = mx_quantize(x, "e4m3", scale_rule="round_up")
    assert up.scale_codes[:, 0].tolist() == [0, 255, 254]
    assert np.all(np.isnan(up.elements[1]))
    assert up.elements[2, 1] == 448.0  # inf saturates; 2 * 2^-127 flushes to zero
    assert up.elements[2, 0] == 0.0


def test_tiny_block_clamps_to_min_scale() -> None:
    # amax 2^-140 (float64): -140 - 8 = -148 clamps to -127 (code 0); 2^-140 / 2^-127 = 2^-13
    # is below half of E4M3's smallest subnormal 2^-9 -> 0.
    t = mx_quantize(np.array([2.0**-140] + [0.0] * 31), "e4m3")
    assert t.scale_codes.tolist() == [0] and t.elements[0] == 0.0
    assert e8m0_scales(np.array([0, 127, 254, 255], np.uint8)).tolist()[1:3] == [1.0, 2.0**127]
    assert e8m0_scales(np.array([0], np.uint8))[0] == np.float32(2.0**-127)


def test_axis_padding_and_shapes() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    t0 = mx_quantize(x, "e5m2", axis=0)
    t1 = mx_quantize(x.T.copy(), "e5m2", axis=-1)
    assert t0.scale_codes.shape == (2, 3)
    np.testing.assert_array_equal(t0.scale_codes, t1.scale_codes.T)
    np.testing.assert_array_equal(t0.elements, t1.elements.T)
    with pytest.raises(ValueError, match="pad=True"):
        mx_quantize(np.ones(40, np.float32), "e4m3")
    p = mx_quantize(np.ones(40, np.float32) * 3.0, "e4m3", pad=True)
    assert p.elements.shape == (40,) and p.scale_codes.shape == (2,)
    np.testing.assert_array_equal(mx_dequantize(p), np.full(40, 3.0, np.float32))


def test_bad_input() -> None:
    with pytest.raises(TypeError):
        mx_quantize(np.arange(32), "e4m3")
    with pytest.raises(ValueError):
        mx_quantize(np.ones(32, np.float32), "e4m3", scale_rule="nearest")
    with pytest.raises(ValueError):
        mx_quantize(np.ones(32, np.float32), "e4m3", block_size=0)
    with pytest.raises(ValueError):
        mx_quantize(np.ones(32, np.float32), "e4m3", axis=1)
    with pytest.raises(ValueError):
        mx_quantize(np.ones(32, np.float32), "nope")
    with pytest.raises(TypeError):
        mx_dequantize(np.ones(3))  # type: ignore[arg-type]


def test_big_endian_float64_is_not_downgraded():
    # amax 300 gives the scale 2^(8 - 8) = 1; 1.0625 + 2^-40 then rounds up to 1.125 from
    # float64, whereas through float32 it would be the tie 1.0625 and go to the even 1.0
    x = np.array([1.0625 + 2.0**-40, 300.0], dtype=">f8")
    t = mx_quantize(x, "e4m3", block_size=2)
    assert t.scale_codes.tolist() == [127] and t.elements.tolist() == [1.125, 288.0]


def test_mxint8_by_hand_and_saturation():
    # amax 3: X = 2^(floor(log2 3) - 0) = 2; k = round(64 * V / 2)
    t = mx_quantize(np.array([3.0, -0.1, 1.5, 0.02]), "int8", block_size=4)
    assert t.scale_codes.tolist() == [128]
    assert t.element_codes().tolist() == [96, -3, 48, 1]  # -3.2 -> -3, 0.64 -> 1
    assert t.element_codes().dtype == np.int8
    assert t.dequantize().tolist() == [3.0, -0.09375, 1.5, 0.03125]
    # 1.999 * 64 = 127.94 rounds to 128: saturates to 127; symmetric on the negative side
    s = mx_quantize(np.array([1.999, -1.999, 0.5, 1.0 / 128]), "mxint8", block_size=4)
    assert s.element_codes().tolist() == [127, -127, 32, 0]  # 0.5 is a tie: 0 is even


def test_mxint8_matches_an_integer_oracle(rng):
    x = rng.standard_normal((16, 64)) * np.exp2(rng.integers(-10, 10, (16, 1)))
    t = mx_quantize(x, "int8", block_size=32)
    blocks = x.reshape(16, 2, 32)
    X = np.exp2(np.floor(np.log2(np.abs(blocks).max(-1, keepdims=True))))  # emax_elem = 0
    k = np.clip(np.rint(blocks / X * 64), -127, 127)  # rint: ties to even
    np.testing.assert_array_equal(t.element_codes(), k.reshape(16, 64).astype(np.int8))
    np.testing.assert_array_equal(t.dequantize(), (k / 64 * X).reshape(16, 64).astype(np.float32))


def test_mxint8_beats_mxfp8_on_gaussian_blocks(rng):
    # 7 magnitude bits of fixed point against E4M3's 3 mantissa bits: within a block of
    # 32 Gaussians the dynamic range is small, so the integer grid is finer where it matters
    x = rng.standard_normal((128, 256))
    e = {f: np.mean((mx_quantize(x, f).dequantize() - x) ** 2) for f in ("int8", "e4m3")}
    assert e["int8"] < 0.5 * e["e4m3"], e
