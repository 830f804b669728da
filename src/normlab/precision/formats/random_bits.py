"""Counter-based random words for stochastic rounding, reproducible in any parallel order.

Dimension letters: N elements (the flattened C-order index of the array being rounded).

Contract: the word of element `i` depends only on `(seed, i)`, never on the order in
which elements are visited, so a threaded kernel reproduces the NumPy reference bit for bit
whatever its thread count. The formula (all arithmetic on uint64, wrapping mod 2^64) is the
first output of a SplitMix64 generator whose state is `seed + i`:

    z = seed + i + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    w_i = z ^ (z >> 31)

Reference: Steele, Lea and Flood, "Fast Splittable Pseudorandom Number Generators"
(OOPSLA 2014); the finaliser constants are Stafford's "Mix13" variant.

Sources of randomness of a stochastic rounding call
([stochastic_source][normlab.precision.formats.random_bits.stochastic_source]): exactly one
of `seed` (an int in [0, 2^64): w_i = splitmix64((seed + i) mod 2^64)), `rng` (a Generator: one draw
`rng.integers(0, 2**63)` becomes the seed) or `random_bits` (the words themselves, uint64, one
per element).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import check_generator

__all__ = ["GOLDEN_GAMMA", "check_seed", "splitmix64", "stochastic_source", "stochastic_words"]

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
"""SplitMix64's state increment, 2^64 divided by the golden ratio (odd)."""
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(counter: np.ndarray) -> np.ndarray:
    """The SplitMix64 output for each uint64 state in `counter` (state advanced once).

    Parameters
    ----------
    counter : numpy.ndarray
        uint64 states, any shape.

    Returns
    -------
    numpy.ndarray
        uint64, the same shape: `mix(counter + 0x9E3779B97F4A7C15)`.

    Examples
    --------
    >>> hex(int(splitmix64(np.array([0], dtype=np.uint64))[0]))
    '0xe220a8397b1dcdaf'
    """
    z = np.asarray(counter, dtype=np.uint64) + np.uint64(GOLDEN_GAMMA)  # wraps mod 2^64
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def stochastic_words(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The random word `w_i = splitmix64(seed + i)` of every element of an array of `shape`.

    Parameters
    ----------
    seed : int
        Any integer; it is taken mod 2^64.
    shape : tuple of int
        Shape of the array being rounded; `i` runs over its flattened C order.

    Returns
    -------
    numpy.ndarray
        uint64 words of `shape`.

    Examples
    --------
    >>> stochastic_words(7, (2, 3)).shape
    (2, 3)
    """
    n = int(np.prod(shape, dtype=np.int64))
    index = np.arange(n, dtype=np.uint64)  # (N,)
    counter = index + np.uint64(int(seed) % 2**64)  # (N,) wraps mod 2^64
    return splitmix64(counter).reshape(shape)


def check_seed(seed: Any, name: str = "seed") -> int:
    """An int (numpy ints too, bools rejected) in [0, 2^64)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [0, 2**64); got {type(seed).__name__} "
                        f"{seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2**64); got {seed}")
    return int(seed)


def stochastic_source(
    stochastic: bool, rng: Any, seed: Any, random_bits: Any, shape: tuple[int, ...]
) -> tuple[int | None, np.ndarray | None]:
    """Validate rng / seed / random_bits; return (seed, words), at most one not None.

    Parameters
    ----------
    stochastic : bool
        Whether the rounding mode needs randomness (then exactly one source is required;
        otherwise `seed` and `random_bits` are refused, and an `rng` is accepted and left
        untouched, so code that passes one Generator to every mode keeps working).
    rng, seed, random_bits
        The caller's arguments (see the module header).
    shape
        The shape of the array being rounded (random_bits must have it).

    Returns
    -------
    seed : int or None
        The seed (an int `rng` draws, or the caller's), or None.
    words : numpy.ndarray or None
        The validated uint64 words of `random_bits`, or None.

    Raises
    ------
    ValueError
        No source for a stochastic call, more than one source, `seed` or `random_bits`
        with a deterministic mode, seed out of range, words of another shape.
    TypeError
        rng not a Generator, seed not an int, random_bits not a uint64 ndarray.

    Examples
    --------
    >>> stochastic_source(True, None, 5, None, (3,))
    (5, None)
    """
    given = [n for n, v in (("rng", rng), ("seed", seed), ("random_bits", random_bits))
             if v is not None]
    if len(given) > 1 or (stochastic and not given):
        raise ValueError(
            "stochastic rounding needs exactly one source of randomness: rng= (a "
            "numpy.random.Generator), seed= (an int in [0, 2**64)) or random_bits= (uint64 "
            f"words of x's shape); got {given or 'none'}"
        )
    if not stochastic:
        if given and given[0] != "rng":  # a Generator may be passed along; nothing is drawn
            raise ValueError(
                f"{given[0]}= is used only by rounding='stochastic' (a deterministic mode "
                f"would ignore it); got {given[0]}= with a deterministic mode: drop it, or "
                "round stochastically"
            )
        return None, None
    if random_bits is not None:
        if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint64:
            raise TypeError(
                "random_bits must be a numpy array of dtype uint64; got "
                f"{getattr(random_bits, 'dtype', type(random_bits).__name__)}"
            )
        if random_bits.shape != shape:
            raise ValueError(
                f"random_bits must have x's shape {shape}; got shape {random_bits.shape}"
            )
        return None, random_bits
    if rng is not None:
        return int(check_generator(rng).integers(0, 2**63, dtype=np.int64)), None
    return check_seed(seed), None
