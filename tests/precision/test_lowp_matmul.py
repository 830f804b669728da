"""lowp_matmul: input rounding, float32 sequential accumulation, low-precision accumulators."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision.training.matmul import lowp_matmul


def test_fp32_accumulation_is_sequential_float32() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 50)).astype(np.float32)
    b = rng.standard_normal((50, 4)).astype(np.float32)
    out = lowp_matmul(a, b, input_format="fp32")
    ref = np.zeros((3, 4), np.float32)
    for i in range(3):  # independent scalar loop: acc = fl32(acc + fl32(a_ik * b_kj))
        for j in range(4):
            acc = np.float32(0.0)
            for k in range(50):
                acc = np.float32(acc + np.float32(a[i, k] * b[k, j]))
            ref[i, j] = acc
    np.testing.assert_array_equal(out, ref, strict=True)  # exact: same operation order


def test_inputs_rounded_like_ml_dtypes() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 1)).astype(np.float32)
    b = rng.standard_normal((1, 6)).astype(np.float32)
    for name, dt in (("bf16", ml_dtypes.bfloat16), ("e4m3", ml_dtypes.float8_e4m3fn)):
        out = lowp_matmul(a, b, input_format=name)
        ra = a.astype(dt).astype(np.float32)
        rb = b.astype(dt).astype(np.float32)
        # K = 1: one product of two rounded inputs, exact in float32 (<= 16 significant bits)
        np.testing.assert_array_equal(out, ra @ rb)


def test_bf16_inputs_float32_accumulation_error_bound() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 300)).astype(np.float32)
    b = rng.standard_normal((300, 5)).astype(np.float32)
    out = lowp_matmul(a, b, input_format="bf16")
    ra = a.astype(ml_dtypes.bfloat16).astype(np.float64)
    rb = b.astype(ml_dtypes.bfloat16).astype(np.float64)
    exact = ra @ rb
    # products are exact; a sequential float32 sum of K terms errs by at most
    # (K - 1) * 2^-24 * sum |terms| (first-order bound)
    bound = 299 * 2.0**-24 * (np.abs(ra) @ np.abs(rb))
    assert np.all(np.abs(out - exact) <= bound)


def test_accumulator_stagnation_and_chunking() -> None:
    # Summing 300 ones: a bf16 accumulator stops at 256 (256 + 1 = 257 is a tie between 256
    # and 258 and rounds to even 256). Rounding every 100 additions keeps exact 100, 200, 300.
    a = np.ones((1, 300), np.float32)
    b = np.ones((300, 1), np.float32)
    assert lowp_matmul(a, b, input_format="bf16").item() == 300.0
    assert lowp_matmul(a, b, input_format="bf16", accumulate_format="bf16").item() == 256.0
    got = lowp_matmul(a, b, input_format="bf16", accumulate_format="bf16", chunk=100)
    assert got.item() == 300.0
    # fp16 accumulator: spacing 2 from 2048, so the same stagnation at 2048 for 3000 ones
    a2, b2 = np.ones((1, 3000), np.float32), np.ones((3000, 1), np.float32)
    assert lowp_matmul(a2, b2, input_format="fp16", accumulate_format="fp16").item() == 2048.0


def test_accumulator_rounded_after_the_last_partial_chunk() -> None:
    # 1 + 2^-9 four times in float32 is 4.0078125; a bf16 accumulator rounded only at the end
    # (chunk 8 > K) gives bf16(4.0078125) = 4.0 (spacing 2^-5 at 4).
    a = np.ones((1, 4), np.float32)
    b = np.full((4, 1), 1 + 2.0**-9, np.float32)
    assert lowp_matmul(a, b, input_format="fp32").item() == 4.0078125
    assert lowp_matmul(a, b, input_format="fp32", accumulate_format="bf16", chunk=8).item() == 4.0


def test_stochastic_accumulator_is_unbiased() -> None:
    # 64 independent rows each summing 300 ones in bf16 with stochastic rounding. Past 256 each
    # addition rounds up or down by 1 with p = 1/2 (variance 1), 44 additions -> row std <= 7,
    # mean of 64 rows std <= 0.9; 5 sigma = 4.5.
    a = np.ones((64, 300), np.float32)
    b = np.ones((300, 1), np.float32)
    out = lowp_matmul(a, b, input_format="bf16", accumulate_format="bf16",
                      rounding="stochastic", rng=np.random.default_rng(7))
    assert abs(out.mean() - 300.0) < 4.5
    assert np.all(out % 2 == 0)  # only bf16 values (spacing 2 in [256, 512))


def test_vector_shapes() -> None:
    v = np.array([1.0, 2.0, 3.0], np.float32)
    m = np.eye(3, dtype=np.float32)
    assert lowp_matmul(v, v, input_format="fp32").shape == ()
    assert lowp_matmul(v, v, input_format="fp32").item() == 14.0
    assert lowp_matmul(m, v, input_format="fp32").tolist() == [1.0, 2.0, 3.0]
    assert lowp_matmul(v, m, input_format="fp32").shape == (3,)


def test_bad_input() -> None:
    a = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        lowp_matmul(np.ones((2, 3), np.int64), a.T, input_format="bf16")
    with pytest.raises(ValueError):
        lowp_matmul(a, a, input_format="bf16")  # K mismatch
    with pytest.raises(ValueError):
        lowp_matmul(a, a.T, input_format="bf16", chunk=2)  # chunk without accumulate_format
    with pytest.raises(ValueError):
        lowp_matmul(a, a.T, input_format="bf16", accumulate_format="bf16", chunk=0)
    with pytest.raises(ValueError):
        lowp_matmul(a, a.T, input_format="bf16", rounding="stochastic")  # no randomness
    with pytest.raises(ValueError):
        lowp_matmul(np.ones((2, 2, 2), np.float32), a, input_format="bf16")


def test_big_endian_float64_is_rounded_once_not_through_float32() -> None:
    # x = 1 + 2^-8 + 2^-40 lies just above the bf16 midpoint between 1 and 1 + 2^-7.
    # Rounded once from float64 it goes up; via float32 it first lands on the midpoint
    # (2^-40 is below float32's half ulp 2^-24), then ties to even go down to 1.
    x = 1.0 + 2.0**-8 + 2.0**-40
    for dt in ("<f8", ">f8"):
        a = np.array([[x]], dtype=dt)
        out = lowp_matmul(a, np.ones((1, 1), dtype=dt), input_format="bf16")
        assert out.item() == 1.0 + 2.0**-7, dt
