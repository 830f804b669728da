"""quantize: accepted inputs, dtype and shape of the result, and rejected inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import BFLOAT16, FLOAT8_E4M3FN, RoundingMode, quantize


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_result_keeps_dtype_and_shape(dtype):
    x = np.linspace(-5, 5, 24, dtype=dtype).reshape(2, 3, 4)
    got = quantize(x, "e4m3")
    assert got.dtype == dtype and got.shape == (2, 3, 4)
    assert quantize(x[:, ::2, 1], "e4m3").shape == (2, 2)  # non-contiguous views
    assert np.array_equal(quantize(x[:, ::2, 1], "e4m3"), got[:, ::2, 1])


def test_python_floats_and_modes_by_enum():
    got = quantize([1.0 + 2.0**-8, 3.0], BFLOAT16, rounding=RoundingMode.NEAREST_AWAY)
    assert got.dtype == np.float64 and got.tolist() == [1 + 2.0**-7, 3.0]
    assert quantize(1.3, "fp4").shape == ()
    assert quantize(np.empty((0, 3), np.float32), "bf16").shape == (0, 3)


@pytest.mark.parametrize(
    "x",
    [np.arange(3), np.array([1, 2], np.int8), np.ones(2, np.complex64),
     np.ones(2, ml_dtypes.float8_e4m3fn), np.array([True]), 3, True, "1.0", None],
    ids=["int64", "int8", "complex64", "float8", "bool", "int", "bool-scalar", "str", "None"],
)
def test_non_float32_64_rejected(x):
    with pytest.raises(TypeError, match="float32 or float64"):
        quantize(x, BFLOAT16)


def test_bad_mode_format_and_saturate():
    x = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="rounding must be one of"):
        quantize(x, BFLOAT16, rounding="up")
    with pytest.raises(ValueError, match="unknown float format"):
        quantize(x, "fp7")
    with pytest.raises(TypeError, match="saturate must be a bool"):
        quantize(x, FLOAT8_E4M3FN, saturate=1)


def test_input_not_modified():
    x = np.array([0.1, 500.0, np.nan], np.float32)
    before = x.copy()
    quantize(x, FLOAT8_E4M3FN, rounding="stochastic", rng=np.random.default_rng(0))
    assert np.array_equal(x, before, equal_nan=True)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e5m2", "fp6_e3m2", "fp4", "e8m0"])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "nearest_away"])
def test_monotone_and_idempotent(fmt, mode):
    # Invariants of any correct rounding to a grid: order is kept, grid values are fixed.
    rng = np.random.default_rng(9)
    x = np.sort(rng.standard_normal(20_000) * np.exp2(rng.uniform(-20, 20, 20_000)))
    if fmt == "e8m0":  # unsigned
        x = np.sort(np.abs(x))
    q = quantize(x, fmt, rounding=mode, saturate=True)
    assert (np.diff(q) >= 0).all()
    assert np.array_equal(quantize(q, fmt, rounding=mode, saturate=True), q)


def test_big_endian_float64_is_rounded_as_float64_not_downgraded():
    # 1 + 2^-30 needs float64: through float32 it would become 1.0 and round to 1.0 in any
    # mode; rounded once from float64, toward_positive gives the next bf16 value.
    x = np.array([1 + 2.0**-30, -(1 + 2.0**-30)], dtype=">f8")
    got = quantize(x, "bf16", rounding="toward_positive")
    assert got.dtype == np.float64 and got.tolist() == [1 + 2.0**-7, -1.0]
    y = np.array([1.5, -2.25], dtype=">f4")
    assert quantize(y, "e4m3").dtype == np.float32


_NARROW_CASES = [(dtype, fmt, mode) for dtype in (np.float16, ml_dtypes.bfloat16)
                 for fmt in ("e4m3", "e5m2", "fp4", "bf16", "fp16")
                 for mode in ("nearest", "toward_zero", "stochastic")]


@pytest.mark.parametrize(("dtype", "fmt", "mode"), _NARROW_CASES)
def test_float16_and_bfloat16_are_rounded_as_the_torch_twin_does(dtype, fmt, mode):
    # the torch twin widens to float32, rounds, and casts back (round to nearest even)
    torch = pytest.importorskip("torch")
    import normlab.torch as nt

    rng = np.random.default_rng(5)
    scale = rng.choice([1e-6, 1.0, 300.0, 1e4], 4096)
    x = (rng.standard_normal(4096) * scale).clip(-6e4, 6e4).astype(dtype)
    x[:4] = [np.inf, -np.inf, np.nan, -0.0]
    seed = 11 if mode == "stochastic" else None
    got = quantize(x, fmt, rounding=mode, seed=seed)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    tdtype = torch.float16 if dtype is np.float16 else torch.bfloat16
    t = torch.from_numpy(x.view(np.int16).copy()).view(tdtype)
    want = nt.quantize(t, fmt, rounding=mode, seed=seed).float().numpy()
    _same_bits(got, want)
    out = np.empty_like(x)
    assert quantize(x, fmt, rounding=mode, seed=seed, out=out) is out
    _same_bits(out, want)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except NaN payloads (the twins' own paths differ in them)."""
    wide = got.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(wide), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(wide[ok].view(np.uint32), want[ok].view(np.uint32))
