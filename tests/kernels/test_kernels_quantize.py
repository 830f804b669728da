"""The quantize kernel is bit-identical to the NumPy reference (no tolerance: exact bits).

Inputs: a random sample of float32 bit patterns (every exponent, NaN payloads, subnormals),
float64 values over the whole range of every format, specials (0, -0, inf, NaN, max and
the overflow boundaries), and for each format every code's value plus the midpoints
between neighbours and the floats just either side of them (the ties and near-ties that
decide rounding). Every named format and a user format, every mode, saturate on and off,
float32 and float64, stochastic with a seed or explicit words, 1 and 2 threads.

The same-exponent-range fast path (float32 -> E8My, round to nearest) is checked on its own:
every bf16 code with its midpoint and the bit patterns either side of it, a large random
bit-pattern sample, hand-computed specials, against the reference and ml_dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from normlab._backend import kernel, use_backend  # noqa: E402
from normlab.precision import NAMED_FORMATS, decode, get_format, quantize  # noqa: E402
from normlab.precision.formats.format import Format, NanConvention  # noqa: E402
from normlab.precision.formats.rounding import (  # noqa: E402
    REFERENCE_ONLY_MODES,
    RoundingMode,
    quantize_reference,
)

_quantize = pytest.importorskip("normlab.kernels.quantize")


@pytest.fixture(autouse=True)
def _parallel_even_when_small(monkeypatch):
    """Small test arrays still take the multi-threaded path (normally serial below 2^17)."""
    from normlab.kernels import _adapt

    monkeypatch.setattr(_adapt, "PARALLEL_MIN_ELEMENTS", 0)


# the named formats, an ExMy user format and flush-to-zero user formats (no subnormals)
# the fnuz formats go through the public quantize, which turns the kernel's -0 into +0
FORMATS = [
    *(f for f in NAMED_FORMATS if f.has_negative_zero or not f.signed),
    get_format("e3m4"),
    Format("e5m2_ftz", 5, 2, has_subnormals=False),
    Format("e4m3fn_ftz", 4, 3, nan=NanConvention.FN, has_subnormals=False),
    Format("u5m2", 5, 2, signed=False),  # unsigned: negative inputs become NaN
]
MODES = [m for m in RoundingMode if m not in REFERENCE_ONLY_MODES]  # the kernel's modes


def _grid(fmt) -> np.ndarray:
    """Every value of fmt (up to 16 bits of code) with the midpoints and their neighbours."""
    if fmt.bits > 16:
        return np.zeros(0)
    codes = np.arange(2**fmt.bits, dtype=np.uint16 if fmt.bits > 8 else np.uint8)
    v = decode(codes, fmt).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])  # sorted
    mid = (v[1:] + v[:-1]) / 2
    return np.concatenate([v, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])


def _inputs(dtype, fmt) -> np.ndarray:
    rng = np.random.default_rng(fmt.bits)
    if dtype == np.float32:
        bits = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32)
        rand = bits.view(np.float32)
    else:
        rand = rng.standard_normal(20_000) * np.exp2(rng.integers(-160, 140, 20_000))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, 2.5, 464.0, 480.0, 57344.0,
                        61440.0, 65520.0, 3.0e38, 1e-40, -1e-45, 2.0**-149])
    with np.errstate(over="ignore"):
        grid = _grid(fmt).astype(dtype)
    return np.concatenate([rand.astype(dtype), special.astype(dtype), grid, -grid])


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bit_identical_every_mode_and_saturate(fmt, dtype):
    x = _inputs(dtype, fmt)
    k = kernel("quantize")
    assert k is not None
    # E8M0 (emin = -127) from float32 is left to the reference (float32 subnormals there
    # follow an ml_dtypes quirk); from float64 the kernel serves it
    served = not (dtype == np.float32 and fmt.emin < -126)
    words = np.random.default_rng(3).integers(0, 2**64, x.shape, dtype=np.uint64)
    for mode in MODES:
        for saturate in (False, True):
            for seed, w in ((12345, None), (None, words)) if mode.value == "stochastic" else (
                (None, None),
            ):
                got = k(x, fmt, mode, saturate, seed, w)
                if not served:
                    assert got is NotImplemented
                    continue
                with np.errstate(all="ignore"):
                    ref = quantize_reference(x, fmt, mode, saturate, seed, w)
                assert got.dtype == x.dtype and got.shape == x.shape
                bad = np.flatnonzero(_bits(got) != _bits(ref))
                assert bad.size == 0, (mode, saturate, x[bad[:4]], got[bad[:4]], ref[bad[:4]])


def test_public_quantize_dispatches_and_matches_with_an_rng():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 33)) * 10).astype(np.float32)[:, ::2]  # strided view
    for fmt in ("bf16", "e4m3", "e5m2", "fp4"):
        with use_backend("numba"):
            a = quantize(x, fmt, rounding="stochastic", rng=np.random.default_rng(9))
            n = quantize(x, fmt)
        with use_backend("numpy"):
            b = quantize(x, fmt, rounding="stochastic", rng=np.random.default_rng(9))
            m = quantize(x, fmt)
        np.testing.assert_array_equal(_bits(a), _bits(b))
        np.testing.assert_array_equal(_bits(n), _bits(m))


def test_stochastic_bits_do_not_depend_on_the_thread_count():
    x = np.random.default_rng(1).standard_normal(100_003).astype(np.float32)
    k = kernel("quantize")
    assert k is not None
    old = numba.get_num_threads()
    outs = []
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            outs.append(k(x, get_format("e4m3"), RoundingMode.STOCHASTIC, False, 77, None))
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    # the words really are used: a different seed changes some roundings
    other = k(x, get_format("e4m3"), RoundingMode.STOCHASTIC, False, 78, None)
    assert np.any(_bits(other) != _bits(outs[0]))


# ----- the same-exponent-range fast path (float32 -> E8My, NEAREST) ---------------------
E8_FORMATS = [
    get_format("bf16"),
    Format("e8m1", 8, 1),
    Format("e8m3", 8, 3),
    Format("e8m10", 8, 10),  # TF32's fields
    Format("e8m22", 8, 22),
]


def _thread_counts() -> list[int]:
    return sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})


def _kernel_bits(x: np.ndarray, fmt: Format, saturate: bool, threads: int) -> np.ndarray:
    k = kernel("quantize")
    assert k is not None
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(threads)
        return _bits(k(x, fmt, RoundingMode.NEAREST, saturate, None, None))
    finally:
        numba.set_num_threads(old)


def _reference_bits(x: np.ndarray, fmt: Format, saturate: bool) -> np.ndarray:
    with use_backend("numpy"), np.errstate(all="ignore"):
        return _bits(quantize(x, fmt, saturate=saturate))


def _neighbourhoods(m: int) -> np.ndarray:
    """Every code of an E8My format (as float32 bits) and the bits that decide its rounding.

    For each code c (kept bits, d = 23 - m dropped bits): c itself, c + 1 ulp, the midpoint
    to the next code and one ulp either side of it, and the last float32 before the next
    code. Both signs, every binade, subnormals, inf and the NaNs are included (2^(9+m) codes).
    """
    d = 23 - m
    codes = np.arange(2 ** (9 + m), dtype=np.uint64) << np.uint64(d)  # (C,)
    half = 1 << (d - 1)
    offsets = np.array([0, 1, half - 1, half, half + 1, (1 << d) - 1], dtype=np.uint64)
    return (codes[:, None] + offsets).reshape(-1).astype(np.uint32).view(np.float32)


def _random_bits(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_fast_path_eligibility_is_read_from_the_format_fields():
    ok = _quantize._same_range_as_float32
    f32, f64, near = np.dtype(np.float32), np.dtype(np.float64), RoundingMode.NEAREST
    for fmt in E8_FORMATS:
        assert ok(fmt, near, f32)
        assert not ok(fmt, near, f64)
        assert not any(ok(fmt, mode, f32) for mode in MODES if mode is not near)
    assert not ok(get_format("fp32"), near, f32)  # nothing to drop: generic kernel
    for fmt in (
        Format("e8m7_b128", 8, 7, bias=128),
        Format("e8m7_ftz", 8, 7, has_subnormals=False),
        Format("u8m7", 8, 7, signed=False),
        get_format("fp16"),
        get_format("e8m0"),
    ):
        assert not ok(fmt, near, f32), fmt


def test_fast_path_serves_bf16_without_the_generic_kernel(monkeypatch):
    from normlab.kernels import quantize_jit

    def generic(*args):
        raise AssertionError("the generic round_nearest kernel was called")

    monkeypatch.setattr(quantize_jit, "round_nearest", generic)
    x = _random_bits(1000, 0)
    np.testing.assert_array_equal(_kernel_bits(x, get_format("bf16"), False, 1),
                                  _reference_bits(x, get_format("bf16"), False))


@pytest.mark.parametrize("saturate", [False, True])
def test_bf16_every_code_neighbourhood_matches_reference_and_ml_dtypes(saturate):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = get_format("bf16")
    x = np.concatenate([_neighbourhoods(7), _random_bits(1 << 20, 7)])  # (N,) N > 2^17
    ref = _reference_bits(x, bf16, saturate)
    if not saturate:  # ml_dtypes has no saturating cast; it also drops NaN payloads
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(
                _bits(x.astype(ml_dtypes.bfloat16).astype(np.float32)), ref)
    for threads in _thread_counts():
        got = _kernel_bits(x, bf16, saturate, threads)
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, (threads, _bits(x)[bad[:4]], got[bad[:4]], ref[bad[:4]])


@pytest.mark.parametrize("fmt", E8_FORMATS[1:], ids=lambda f: f.name)
@pytest.mark.parametrize("saturate", [False, True])
def test_other_e8_formats_match_reference(fmt, saturate):
    x = _random_bits(1 << 18, fmt.mantissa_bits)
    if fmt.mantissa_bits <= 10:  # 2^(9+m) codes: exhaustive up to E8M10
        x = np.concatenate([_neighbourhoods(fmt.mantissa_bits), x])
    ref = _reference_bits(x, fmt, saturate)
    for threads in _thread_counts():
        np.testing.assert_array_equal(_kernel_bits(x, fmt, saturate, threads), ref)


def test_bf16_specials_by_hand():
    """Expected bits written out: NaN payloads and signs, inf, max, subnormals, ties."""
    cases = {  # input bits: (nearest, saturate)
        0x7F800001: (0x7FC00000, 0x7FC00000),  # signalling NaN -> quiet NaN, payload dropped
        0x7FBFFFFF: (0x7FC00000, 0x7FC00000),
        0x7FC00001: (0x7FC00000, 0x7FC00000),
        0xFF800001: (0xFFC00000, 0xFFC00000),  # the NaN keeps its sign
        0xFFFFFFFF: (0xFFC00000, 0xFFC00000),
        0x7F800000: (0x7F800000, 0x7F7F0000),  # +inf; saturate: bf16 max
        0xFF800000: (0xFF800000, 0xFF7F0000),
        0x7F7FFFFF: (0x7F800000, 0x7F7F0000),  # float32 max overflows
        0xFF7FFFFF: (0xFF800000, 0xFF7F0000),
        0x7F7F8000: (0x7F800000, 0x7F7F0000),  # tie above bf16 max: odd kept bits, up
        0x7F7F7FFF: (0x7F7F0000, 0x7F7F0000),  # just below that tie: bf16 max
        0x7F7E8000: (0x7F7E0000, 0x7F7E0000),  # tie, even kept bits: down
        0x3F808000: (0x3F800000, 0x3F800000),  # 1 + 2^-8: tie to even (1.0)
        0x3F818000: (0x3F820000, 0x3F820000),  # odd kept bits: up
        0x00000000: (0x00000000, 0x00000000),
        0x80000000: (0x80000000, 0x80000000),  # -0.0 keeps its sign
        0x00000001: (0x00000000, 0x00000000),  # smallest float32 subnormal -> 0
        0x80000001: (0x80000000, 0x80000000),
        0x00008000: (0x00000000, 0x00000000),  # subnormal tie, even: 0
        0x00018000: (0x00020000, 0x00020000),  # subnormal tie, odd: up
        0x00008001: (0x00010000, 0x00010000),  # above the tie: smallest bf16 subnormal
        0x007FFFFF: (0x00800000, 0x00800000),  # largest subnormal -> min normal
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    bf16 = get_format("bf16")
    for column, saturate in enumerate((False, True)):
        want = np.array([v[column] for v in cases.values()], dtype=np.uint32)
        np.testing.assert_array_equal(_reference_bits(x, bf16, saturate), want)
        for threads in _thread_counts():
            np.testing.assert_array_equal(_kernel_bits(x, bf16, saturate, threads), want)


# ----- the narrow fast path (float32 -> fp8 / fp6 / fp4, NEAREST) ---------------------
NARROW_FORMATS = [f for f in FORMATS if f.exponent_bits < 8 and f.mantissa_bits >= 1] + [
    get_format(name) for name in ("e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz")]


def test_narrow_path_eligibility_is_read_from_the_format_fields():
    ok = _quantize.narrow_nearest_serves
    f32, f64, near = np.dtype(np.float32), np.dtype(np.float64), RoundingMode.NEAREST
    for name in ("e4m3", "e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "fp16", "e4m3fnuz"):
        fmt = get_format(name)
        assert ok(fmt, near, f32), name
        assert not ok(fmt, near, f64)
        assert not any(ok(fmt, mode, f32) for mode in MODES if mode is not near)
    for name in ("e8m0", "fp32"):  # m = 0 (ties go up), nothing to drop
        assert not ok(get_format(name), near, f32), name


@pytest.mark.parametrize("fmt", NARROW_FORMATS, ids=lambda f: f.name)
def test_narrow_formats_every_code_neighbourhood_matches_reference(fmt, monkeypatch):
    """Every float32 pattern at and around each rounding boundary (normal range: the E8My
    neighbourhoods with m = the target's; subnormal range: the grid's midpoints and their
    neighbours), random patterns, specials; 1 and 2 threads, saturate on and off."""
    from normlab.kernels import quantize_jit

    def generic(*args):
        raise AssertionError("the generic round_nearest kernel was called")

    monkeypatch.setattr(quantize_jit, "round_nearest", generic)
    with np.errstate(over="ignore"):
        grid = _grid(fmt).astype(np.float32)
    near = _neighbourhoods(fmt.mantissa_bits) if fmt.mantissa_bits <= 7 else grid[:0]
    x = np.concatenate([near, grid, -grid,  # fp16: the grid alone has every code
                        _inputs(np.float32, fmt), _random_bits(1 << 16, fmt.bits)])
    for saturate in (False, True):
        with np.errstate(all="ignore"):
            ref = _bits(quantize_reference(x, fmt, RoundingMode.NEAREST, saturate, None, None))
        for threads in _thread_counts():
            got = _kernel_bits(x, fmt, saturate, threads)
            if not fmt.has_negative_zero and fmt.signed:  # fnuz: quantize turns -0 into +0
                got = np.where(got == 0x80000000, np.uint32(0), got)
            bad = np.flatnonzero(got != ref)
            assert bad.size == 0, (saturate, threads, _bits(x)[bad[:4]], got[bad[:4]],
                                   ref[bad[:4]])
