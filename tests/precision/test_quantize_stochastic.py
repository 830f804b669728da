"""Stochastic rounding: two neighbours only, unbiased, P(up) = position, reproducible.

Dimension letters: N samples. Statistical tolerances are 5 standard deviations of the
estimate (Bernoulli(t) with N samples: sd of the up-fraction sqrt(t (1 - t) / N)), so a
correct implementation fails with probability below 1e-6 per check, while a bias of a
tenth of an ulp (what truncating the random word to a few bits would give) fails surely.
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab import _backend
from normlab.precision import (
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    RoundingMode,
    quantize,
    splitmix64,
    stochastic_words,
)

N = 2**17


def _ulp(x, fmt):
    """Grid spacing of fmt at |x| from the definition: 2^(max(floor(log2|x|), emin) - m)."""
    _, e = np.frexp(np.abs(x).astype(np.float64))
    e = np.where(x == 0, fmt.emin + 1, e)  # zero: the subnormal spacing
    return np.exp2(np.maximum(e - 1, fmt.emin) - fmt.mantissa_bits)


@pytest.mark.parametrize("fmt", [BFLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT4_E2M1FN])
def test_only_the_two_neighbours(fmt):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(N) * np.exp2(rng.uniform(-12, 3, N))).astype(np.float32)
    x = x[np.abs(x) < fmt.max]
    q = quantize(x, fmt, rounding="stochastic", rng=rng).astype(np.float64)
    lo = quantize(x, fmt, rounding="toward_zero").astype(np.float64)
    hi = np.sign(x) * (np.abs(lo) + _ulp(lo, fmt))  # exact: small dyadic numbers
    assert ((q == lo) | (q == hi)).all()
    exact = lo == x
    assert (q[exact] == x[exact]).all()  # representable values never move
    assert (q != lo).any() and (q == lo).any()


@pytest.mark.parametrize(
    ("fmt", "lo", "t"),
    [
        (BFLOAT16, 1.0, 0.25),
        (BFLOAT16, -3.0, 0.8125),
        (FLOAT8_E4M3FN, 1.0, 0.5),
        (FLOAT8_E4M3FN, 2.0**-9, 0.0625),  # subnormals: quantum 2^-9
        (FLOAT4_E2M1FN, 4.0, 0.3),  # t = 0.3 is float32(0.6) / 2: position in [4, 6]
    ],
)
def test_unbiased_and_up_probability_is_the_position(fmt, lo, t):
    ulp = float(_ulp(np.array([lo]), fmt)[0])
    x = np.float32(lo + np.sign(lo) * t * ulp)
    t = (abs(float(x)) - abs(lo)) / ulp  # the exact position of the float32 input
    q = quantize(np.full(N, x), fmt, rounding="stochastic", rng=np.random.default_rng(17))
    up = np.abs(q.astype(np.float64)) > abs(lo)
    sd = np.sqrt(t * (1 - t) / N)
    assert abs(up.mean() - t) < 5 * sd, (up.mean(), t)
    mean_err = q.astype(np.float64).mean() - float(x)
    assert abs(mean_err) < 5 * sd * ulp  # unbiased: E[q] = x


def test_stratified_words_give_exact_probability():
    # x = 1 + 5/16 ulp in E4M3 (ulp 1/8): with words j * 2^60, j = 0..15, exactly 5 round up.
    x = np.full(16, 1 + 5 / 128, np.float32)
    words = (np.arange(16, dtype=np.uint64) << np.uint64(60)).astype(np.uint64)
    q = quantize(x, FLOAT8_E4M3FN, rounding="stochastic", random_bits=words)
    assert (q == 1.125).sum() == 5 and (q == 1.0).sum() == 11
    assert (q[11:] == 1.125).all()  # the largest words round up


def test_same_seed_same_result_and_one_draw_from_rng():
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    a = quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.default_rng(42))
    b = quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.default_rng(42))
    c = quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.default_rng(43))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    rng, twin = np.random.default_rng(42), np.random.default_rng(42)
    quantize(x, BFLOAT16, rounding="stochastic", rng=rng)
    seed = twin.integers(0, 2**63, dtype=np.int64)  # the single documented draw
    assert rng.random() == twin.random()
    words = stochastic_words(int(seed), x.shape)
    assert np.array_equal(a, quantize(x, BFLOAT16, rounding="stochastic", random_bits=words))


def test_words_follow_flat_index_whatever_the_shape():
    x = np.linspace(-3, 3, 24, dtype=np.float32)
    flat = quantize(x, FLOAT8_E5M2, rounding="stochastic", rng=np.random.default_rng(1))
    grid = quantize(x.reshape(2, 3, 4), FLOAT8_E5M2, rounding="stochastic",
                    rng=np.random.default_rng(1))
    assert np.array_equal(flat.reshape(2, 3, 4), grid)


def test_splitmix64_words_match_the_documented_formula():
    def word(seed, i):  # the formula of random_bits.py, in Python integers
        z = (seed + i + 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)

    seed = 2**63 - 5  # wraps past 2^64 with the golden gamma added
    got = stochastic_words(seed, (3, 5)).reshape(-1)
    assert [int(g) for g in got] == [word(seed, i) for i in range(15)]
    # published first output of SplitMix64 seeded with 0
    assert int(splitmix64(np.zeros(1, np.uint64))[0]) == 0xE220A8397B1DCDAF


def test_stochastic_bad_input():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="exactly one source of randomness"):
        quantize(x, BFLOAT16, rounding="stochastic")
    with pytest.raises(ValueError, match="exactly one source"):
        quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.default_rng(0),
                 random_bits=np.zeros(3, np.uint64))
    with pytest.raises(TypeError, match="uint64"):
        quantize(x, BFLOAT16, rounding="stochastic", random_bits=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="shape"):
        quantize(x, BFLOAT16, rounding="stochastic", random_bits=np.zeros(4, np.uint64))
    with pytest.raises(TypeError, match="Generator"):
        quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.RandomState(0))


def test_kernel_seam_receives_the_drawn_seed(monkeypatch):
    calls = []

    def fake(x, fmt, mode, saturate, seed, words):
        calls.append((x.dtype, fmt, mode, saturate, seed, words))
        return NotImplemented  # falls back to the reference

    monkeypatch.setattr(_backend, "kernel", lambda name: fake if name == "quantize" else None)
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    got = quantize(x, "bf16", rounding="stochastic", rng=np.random.default_rng(3))
    seed = int(np.random.default_rng(3).integers(0, 2**63, dtype=np.int64))
    assert calls == [(np.float32, BFLOAT16, RoundingMode.STOCHASTIC, False, seed, None)]
    words = stochastic_words(seed, x.shape)
    assert np.array_equal(got, quantize(x, "bf16", rounding="stochastic", random_bits=words))


def _splitmix64_by_hand(state: int) -> int:
    """SplitMix64 on Python ints (Steele, Lea and Flood 2014; Stafford's Mix13 constants)."""
    z = (state + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_seed_uses_splitmix64_of_seed_plus_the_flat_index():
    # The documented scheme, reproduced here from the formula with Python ints: element i
    # (C order) rounds up iff rem / quantum * 2^64 + w_i >= 2^64, w_i = splitmix64(seed + i).
    # x = 1 + 2^-5 in E4M3 sits a quarter of the way to 1.125: up iff w_i >= 3 * 2^62.
    seed = 2**64 - 3  # the counter wraps mod 2^64 after two elements
    x = np.full((2, 3), 1 + 2.0**-5)
    got = quantize(x, FLOAT8_E4M3FN, rounding="stochastic", seed=seed)
    words = [_splitmix64_by_hand((seed + i) % 2**64) for i in range(6)]
    want = np.array([1.125 if w >= 3 << 62 else 1.0 for w in words]).reshape(2, 3)
    assert np.array_equal(got, want)
    assert np.array_equal(got, quantize(x, FLOAT8_E4M3FN, rounding="stochastic",
                                        random_bits=np.array(words, np.uint64).reshape(2, 3)))
    assert [int(w) for w in stochastic_words(seed, (6,))] == words


def test_rng_draws_one_seed_and_uses_the_same_scheme():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    a = quantize(x, BFLOAT16, rounding="stochastic", rng=np.random.default_rng(4))
    seed = int(np.random.default_rng(4).integers(0, 2**63, dtype=np.int64))
    b = quantize(x, BFLOAT16, rounding="stochastic", seed=seed)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_seed_gives_the_same_bits_on_both_backends(backend):
    x = np.random.default_rng(1).standard_normal((33, 65)).astype(np.float32)
    with _backend.use_backend(backend):
        got = quantize(x, FLOAT8_E5M2, rounding="stochastic", seed=123)
    want = quantize(x, FLOAT8_E5M2, rounding="stochastic",
                    random_bits=stochastic_words(123, x.shape))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({}, ValueError, "exactly one source"),
        ({"seed": 1, "rng": np.random.default_rng(0)}, ValueError, r"\['rng', 'seed'\]"),
        ({"seed": 1, "random_bits": np.zeros(3, np.uint64)}, ValueError, "exactly one"),
        ({"seed": -1}, ValueError, r"\[0, 2\*\*64\)"),
        ({"seed": 2**64}, ValueError, "got 18446744073709551616"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"seed": True}, TypeError, "seed must be an int"),
    ],
)
def test_randomness_arguments_rejected(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        quantize(np.ones(3), BFLOAT16, rounding="stochastic", **kwargs)


def test_deterministic_modes_take_a_generator_refuse_a_seed_and_reject_two():
    x = np.array([1 + 2.0**-9])
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert quantize(x, BFLOAT16, rng=rng).tolist() == [1.0]  # passed along, nothing drawn
    assert rng.bit_generator.state == before
    for source in ({"seed": 3}, {"random_bits": np.zeros(1, np.uint64)}):
        name = next(iter(source))
        with pytest.raises(ValueError, match=f"{name}= is used only by rounding='stochastic'"):
            quantize(x, BFLOAT16, **source)  # used to be ignored silently
    with pytest.raises(ValueError, match="exactly one"):
        quantize(x, BFLOAT16, seed=3, rng=np.random.default_rng(0))
