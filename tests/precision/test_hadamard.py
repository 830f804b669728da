"""Random Hadamard transform: the matrix by hand, the signs from SplitMix64, exact inverse."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.precision import (
    hadamard_matrix,
    inverse_random_hadamard_transform,
    random_hadamard_transform,
)


def _splitmix64(state: int) -> int:
    z = (state + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_sylvester_matrix_by_hand():
    assert hadamard_matrix(4).tolist() == [[1, 1, 1, 1], [1, -1, 1, -1],
                                           [1, 1, -1, -1], [1, -1, -1, 1]]
    h = hadamard_matrix(16)
    np.testing.assert_array_equal(h @ h.T, 16 * np.eye(16))
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(12)


def test_rows_are_signed_hadamard_rows():
    # the unit vector e_j maps to d_j * H[j] / 4 with d_j from the top bit of the word
    seed = 2**64 - 2
    y = random_hadamard_transform(np.eye(16), seed=seed)
    d = [1 - 2 * (_splitmix64((seed + j) % 2**64) >> 63) for j in range(16)]
    np.testing.assert_array_equal(y, np.array(d)[:, None] * hadamard_matrix(16) / 4)


def test_exact_inverse_and_orthogonality(rng):
    ints = rng.integers(-50, 50, (3, 64)).astype(np.float64)  # partial sums exact
    for axis in (-1, 0):
        x = ints if axis == -1 else ints.T.copy()
        y = random_hadamard_transform(x, seed=3, axis=axis)
        np.testing.assert_array_equal(inverse_random_hadamard_transform(y, seed=3, axis=axis), x)
    x32 = rng.standard_normal((8, 32)).astype(np.float32)
    y32 = random_hadamard_transform(x32, seed=9)
    assert y32.dtype == np.float32
    # float32: one 16-term dot product each way, error a few ulps of the row scale
    np.testing.assert_allclose(inverse_random_hadamard_transform(y32, seed=9), x32,
                               rtol=0, atol=16 * 2.0**-23 * np.abs(x32).max())
    np.testing.assert_allclose(np.linalg.norm(y32, axis=1), np.linalg.norm(x32, axis=1),
                               rtol=1e-6)


def test_gemm_identity_along_the_contraction_axis(rng):
    # (A M)(M^T B) = A B: transform A along its columns and B along its rows, same seed
    a, b = rng.standard_normal((5, 32)), rng.standard_normal((32, 7))
    ta = random_hadamard_transform(a, seed=1, axis=1)
    tb = random_hadamard_transform(b, seed=1, axis=0)
    np.testing.assert_allclose(ta @ tb, a @ b, rtol=0, atol=1e-12)


def test_spreads_an_outlier():
    # the point of the RHT before NVFP4: a lone outlier becomes 16 values of equal size
    x = np.zeros(16)
    x[5] = 100.0
    np.testing.assert_array_equal(np.abs(random_hadamard_transform(x, seed=4)), 25.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of block"):
        random_hadamard_transform(np.ones(20), seed=0)
    with pytest.raises(TypeError, match="seed"):
        random_hadamard_transform(np.ones(16), seed=1.5)
    with pytest.raises(ValueError, match="seed"):
        random_hadamard_transform(np.ones(16), seed=-1)
    with pytest.raises(ValueError, match="axis"):
        random_hadamard_transform(np.ones(16), seed=0, axis=1)
