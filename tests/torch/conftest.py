"""normlab.torch tests: PyTorch is an optional extra (skipped without it); shared inputs.

The input fixtures are bit patterns that hit every rounding case: all exponents, ties at
every cut position, and the specials.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

SPECIALS32 = np.array(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
     0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00400001, 0x00800000, 0x7F7FFFFF],
    dtype=np.uint32,
)


def cut_patterns(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """n random words whose bits below a random cut are 0, 10..0, 01..1 or 10..01 (uint64).

    A cut at c makes the low c bits a tie, just below, just above or exact for any
    rounding that discards c bits, so every target width sees its ties.
    """
    words = rng.integers(0, 2**63, size=n, dtype=np.uint64) << np.uint64(1)
    words |= rng.integers(0, 2, size=n, dtype=np.uint64)
    if width == 32:
        words &= np.uint64(0xFFFFFFFF)
    cut = rng.integers(1, 54 if width == 64 else 25, size=n).astype(np.uint64)
    low_mask = (np.uint64(1) << cut) - np.uint64(1)
    top = np.uint64(1) << (cut - np.uint64(1))
    kind = rng.integers(0, 4, size=n)
    low = np.select(
        [kind == 0, kind == 1, kind == 2, kind == 3],
        [np.uint64(0) * cut, top, top - np.uint64(1), top | np.uint64(1)],
        default=np.uint64(0),
    )
    return (words & ~low_mask) | low


def float32_inputs(rng: np.random.Generator, n_random: int = 2**14) -> np.ndarray:
    """Every top-16-bit pattern (all exponents, signs, top mantissa bits; every tie of a
    format with m <= 7) with a random low half, cut patterns (ties of the wider formats)
    and specials: float32."""
    top = np.arange(2**16, dtype=np.uint32) << np.uint32(16)
    low = rng.integers(0, 2**16, size=2**16, dtype=np.uint32)
    low[rng.random(2**16) < 0.5] = 0  # half the patterns end in zeros: exact ties
    parts = [top | low, cut_patterns(rng, n_random, 32).astype(np.uint32), SPECIALS32]
    return np.concatenate(parts).view(np.float32)


def float64_inputs(rng: np.random.Generator, n_random: int = 2**14) -> np.ndarray:
    """Cut patterns with exponents around float32's range (where formats live), fully
    random patterns, widened float32 specials, float64 subnormals: float64."""
    w = cut_patterns(rng, n_random, 64)
    exponent = rng.integers(1023 - 180, 1023 + 140, size=n_random).astype(np.uint64)
    w = (w & np.uint64(0x800FFFFFFFFFFFFF)) | (exponent << np.uint64(52))
    wild = rng.integers(0, 2**63, size=n_random // 4, dtype=np.uint64) << np.uint64(1)
    sub = rng.integers(0, 2**52, size=64, dtype=np.uint64)
    with np.errstate(invalid="ignore"):  # the signalling NaN pattern is quieted: intended
        specials = SPECIALS32.view(np.float32).astype(np.float64).view(np.uint64)
    return np.concatenate([w, wild, sub, specials]).view(np.float64)


def random_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """uint64 words, with the extremes 0, 1, 2^63 and 2^64 - 1 planted at the start."""
    w = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    w[:4] = [0, 1, 2**63, 2**64 - 1]
    return w


@pytest.fixture(scope="session")
def patterns():
    """{"float32": (x, words), "float64": (x, words)}: inputs and uint64 words, seeded."""
    rng = np.random.default_rng(11)
    x32 = float32_inputs(rng)
    x64 = float64_inputs(rng)
    return {"float32": (x32, random_words(rng, x32.size)),
            "float64": (x64, random_words(rng, x64.size))}
