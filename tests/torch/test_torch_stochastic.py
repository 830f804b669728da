"""Stochastic rounding of normlab.torch.quantize: the fast kernels against NumPy, bit for bit.

Oracles: the NumPy reference :func:`normlab.precision.quantize` (same words, compared on
the bits, NaN sign included) and, for the words at the rounding threshold, exact rational
arithmetic (``fractions.Fraction``) done here from the definition "round up iff
frac + w / 2^64 >= 1": the smallest word that rounds up is ``2^64 - floor(frac * 2^64)``.
Tolerance 0 everywhere: the rounding is exact, every difference is a bug.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab.precision import Format, get_format, quantize, stochastic_words
from normlab.torch import _stochastic

# the recipes' formats (NVFP4 E2M1, FP8, bf16/fp16), the fp6 pair, fnuz and a custom E8M3
FAST = ["e2m1", "e4m3", "e5m2", "bf16", "fp16", "e3m2", "e2m3", "e4m3fnuz", "e5m2fnuz",
        Format("e8m3", 8, 3)]
EDGE_WORDS = [0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def _fmt_id(f: object) -> str:
    return f.name if isinstance(f, Format) else str(f)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _same(x: np.ndarray, fmt: object, saturate: bool, **kw: object) -> None:
    """torch == NumPy bit for bit; ``kw`` is seed= or random_bits= (uint64 ndarray)."""
    tkw = dict(kw)
    if "random_bits" in kw:
        tkw["random_bits"] = torch.from_numpy(np.asarray(kw["random_bits"]).view(np.int64))
    with np.errstate(over="ignore", invalid="ignore"):
        want = quantize(x, fmt, rounding="stochastic", saturate=saturate, **kw)
    got = nt.quantize(torch.from_numpy(x), fmt, rounding="stochastic", saturate=saturate,
                      **tkw).numpy()
    bad = np.nonzero(_bits(want) != _bits(got))[0]
    assert bad.size == 0, (_fmt_id(fmt), saturate, x[bad[:4]], want[bad[:4]], got[bad[:4]])


def test_fast_kernels_cover_the_recipe_formats():
    for name in ("e2m1", "e4m3", "e5m2", "bf16", "fp16"):
        assert _stochastic.fast_kernel(get_format(name), False) is not None, name
    # the general bit path keeps what the kernels do not claim
    assert _stochastic.fast_kernel(get_format("e8m0"), False) is None
    assert _stochastic.fast_kernel(Format("ftz", 4, 3, has_subnormals=False), False) is None


@pytest.mark.parametrize("fmt", FAST, ids=_fmt_id)
def test_every_bf16_prefix_with_random_and_edge_words(patterns, fmt):
    x, w = patterns["float32"]  # every top-16-bit pattern, cut patterns, specials
    for saturate in (False, True):
        _same(x, fmt, saturate, random_bits=w)
        for edge in EDGE_WORDS:  # one word for every element
            _same(x, fmt, saturate, random_bits=np.full(x.shape, edge, np.uint64))


def _threshold(v: float, fmt: Format) -> tuple[int, float, float]:
    """(r64, lower, upper) for |v| > 0 finite within range: r64 = floor(frac 2^64), and the
    neighbours of |v| on fmt's grid, by exact rational arithmetic."""
    a = Fraction(abs(v))
    t = math.frexp(abs(v))[1] - 1  # floor(log2 |v|)
    qe = max(t, fmt.emin) - fmt.mantissa_bits
    q = Fraction(2) ** qe
    keep = math.floor(a / q)
    return math.floor((a / q - keep) * 2**64), float(keep * q), float((keep + 1) * q)


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2", "bf16", "fp16"])
def test_words_at_the_threshold(fmt):
    f = get_format(fmt)
    rng = np.random.default_rng(3)
    # magnitudes spread over the format's normal and subnormal range and far below it
    e = rng.integers(f.emin - f.mantissa_bits - 30, f.emax, size=600)
    x = (rng.uniform(1, 2, size=e.size) * 2.0 ** e).astype(np.float32)
    x[::2] *= -1
    rows = [(xi, *_threshold(float(xi), f)) for xi in x]
    rows = [r for r in rows if 0 < r[1] and r[3] <= f.max]  # inexact, no overflow
    xs = np.array([r[0] for r in rows], np.float32)
    up = np.array([2**64 - r[1] for r in rows], np.uint64)  # the smallest word going up
    for words, pick in ((up, 3), (up - np.uint64(1), 2)):
        got = nt.quantize(torch.from_numpy(xs), f, rounding="stochastic",
                          random_bits=torch.from_numpy(words.view(np.int64))).numpy()
        want = np.array([math.copysign(r[pick], r[0]) for r in rows], np.float32)
        assert np.array_equal(got, want), fmt
        _same(xs, f, False, random_bits=words)


@pytest.mark.parametrize("fmt", [*FAST, "e8m0", "e4m3fnu"], ids=_fmt_id)
def test_seed_wraps_past_2_64_across_chunks(fmt):
    # seed + i passes 2^64 inside the tensor, which spans several CPU chunks and a ragged end
    n = 2 * _stochastic.CHUNK + 1000
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, size=n)).astype(np.float32)
    x[:3] = [np.inf, -np.nan, -0.0]
    for seed in (2**64 - 1000, 2**64 - _stochastic.CHUNK - 7, 0):
        _same(x, fmt, False, seed=seed)
    _same(x, fmt, True, seed=2**64 - 1)


def test_float64_and_half_inputs_use_the_same_words():
    rng = np.random.default_rng(6)
    x64 = rng.standard_normal(70_000) * 3
    _same(x64, "e2m1", True, seed=2**64 - 50_000)  # float64: the general bit path, chunked
    x = torch.from_numpy(x64.astype(np.float32)).to(torch.bfloat16)
    got = nt.quantize(x, "e4m3", rounding="stochastic", seed=9)
    want = quantize(x.float().numpy(), "e4m3", rounding="stochastic", seed=9)
    assert got.dtype == torch.bfloat16
    assert np.array_equal(got.float().numpy(), want)  # e4m3 values are bf16 values


def test_words_chunked_equal_words_whole():
    n = _stochastic.CHUNK + 3
    whole = nt.stochastic_words(2**64 - 2, (n,))
    want = stochastic_words(2**64 - 2, (n,)).view(np.int64)
    assert np.array_equal(whole.numpy(), want)
    top = _stochastic._words(2**64 - 2, 0, n, "cpu", top_only=True)
    assert torch.equal(top >> 33, whole >> 33)  # the skipped xor-shift leaves the top 31
