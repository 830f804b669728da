"""Counter-based random words for stochastic rounding, reproducible in any parallel order.

Dimension letters: N elements (the flattened C-order index of the array being rounded).

Contract: the word of element ``i`` depends only on ``(seed, i)``, never on the order in
which elements are visited, so a threaded kernel reproduces the NumPy reference bit for bit
whatever its thread count. The formula (all arithmetic on uint64, wrapping mod 2^64) is the
first output of a SplitMix64 generator whose state is ``seed + i``:

    z = seed + i + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    w_i = z ^ (z >> 31)

Reference: Steele, Lea and Flood, "Fast Splittable Pseudorandom Number Generators"
(OOPSLA 2014); the finaliser constants are Stafford's "Mix13" variant.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GOLDEN_GAMMA", "splitmix64", "stochastic_words"]

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(counter: np.ndarray) -> np.ndarray:
    """The SplitMix64 output for each uint64 state in ``counter`` (state advanced once).

    Parameters
    ----------
    counter : ndarray of uint64, any shape

    Returns
    -------
    ndarray of uint64, same shape: ``mix(counter + 0x9E3779B97F4A7C15)``.

    Example
    -------
    >>> hex(int(splitmix64(np.array([0], dtype=np.uint64))[0]))
    '0xe220a8397b1dcdaf'
    """
    z = np.asarray(counter, dtype=np.uint64) + np.uint64(GOLDEN_GAMMA)  # wraps mod 2^64
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def stochastic_words(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The random word ``w_i = splitmix64(seed + i)`` of every element of an array of ``shape``.

    Parameters
    ----------
    seed : int
        Any integer; it is taken mod 2^64.
    shape : tuple of int
        Shape of the array being rounded; ``i`` runs over its flattened C order.

    Returns
    -------
    ndarray of uint64 with ``shape``.

    Example
    -------
    >>> stochastic_words(7, (2, 3)).shape
    (2, 3)
    """
    n = int(np.prod(shape, dtype=np.int64))
    index = np.arange(n, dtype=np.uint64)  # (N,)
    counter = index + np.uint64(int(seed) % 2**64)  # (N,) wraps mod 2^64
    return splitmix64(counter).reshape(shape)
