r"""Random Hadamard transform (RHT) in blocks along an axis, and its inverse.

Dimension letters: N the transformed axis' length, b the block size, nB = N / b.

Contract: with $H_b$ the Sylvester Hadamard matrix ($H_1 = [1]$,
$H_{2k} = [[H_k, H_k], [H_k, -H_k]]$; symmetric, $H_b H_b = b I$) and $D = \mathrm{diag}(d)$
a random sign vector, `d_j = 1 - 2 * (splitmix64(seed + j) >> 63)` for j = 0..b-1 (the top
bit of the word of [normlab.precision.formats.random_bits][]), every block of b consecutive
elements along `axis` is mapped as

$$
y = x D H_b / \sqrt{b}, \qquad x = (y H_b / \sqrt{b}) \odot d
$$

(the transform is $y = x M$ with $M = D H_b / \sqrt{b}$, $M M^T = I$; the inverse is
$y M^T$).

The same sign vector serves every block (NVIDIA, "Pretraining Large Language Models with
NVFP4", 2025, sec. 4.2: 16 x 16 RHTs on the inputs of the weight-gradient GEMM, one random
sign vector; both GEMM operands are transformed along the contraction axis, so
(A M)(M^T B) = A B). For b = 16 the normalisation 1/4 is a power of two. Arithmetic is in
x's dtype (float32 or float64; other float types are computed in float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int
from normlab.precision.formats.random_bits import check_seed, splitmix64
from normlab.precision.scaled.namespace import NUMPY, ArrayNamespace, namespace_of

__all__ = ["hadamard_matrix", "inverse_random_hadamard_transform",
           "random_hadamard_transform"]


def hadamard_matrix(b: int) -> np.ndarray:
    """The b x b Sylvester Hadamard matrix (entries +-1, float64); `b` a power of two.

    Examples
    --------
    >>> hadamard_matrix(2).tolist()
    [[1.0, 1.0], [1.0, -1.0]]
    """
    n = check_int(b, "block", minimum=1)
    if n & (n - 1):
        raise ValueError(f"block must be a power of two (Sylvester construction); got {b}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_signs(seed: Any, b: int) -> np.ndarray:
    r"""The sign vector $d_j = 1 - 2 (\mathrm{splitmix64}(seed + j) \gg 63)$, float64 (b,)."""
    counter = np.arange(b, dtype=np.uint64) + np.uint64(check_seed(seed))  # b, mod 2^64
    return 1.0 - 2.0 * (splitmix64(counter) >> np.uint64(63)).astype(np.float64)  # b


def rht_matrix(block: int, seed: Any, *, inverse: bool = False) -> np.ndarray:
    r"""The b x b float64 matrix of the transform, $M = D H_b / \sqrt{b}$, or of its inverse
    $M^T = H_b D / \sqrt{b}$; every backend builds its transform from this one matrix."""
    h = hadamard_matrix(block)
    d = rht_signs(seed, block)
    return (h * d[None, :] if inverse else h * d[:, None]) / np.sqrt(block)  # b,b


def rht_apply(x: Any, m: Any, axis: int, *, xp: ArrayNamespace | None = None) -> Any:
    """`x @ m` on every block of `m.shape[0]` elements along `axis` (one matmul; its
    summation order is the backend's). `x.shape[axis]` must be a multiple of the block.

    Blocks are taken where they lie: along the last axis as rows (`blocks @ m`), along an
    earlier axis as (b, P) slabs of the following P elements (`m^T @ slab`), so no operand
    is transposed or copied first. Each output element is the same 16-term dot product
    either way.
    """
    xp = namespace_of(x) if xp is None else xp
    b = m.shape[0]
    shape = tuple(x.shape)
    ax = axis % len(shape)
    if ax == len(shape) - 1:
        blocks = xp.reshape(x, (*shape[:-1], shape[-1] // b, b))  # ...,nB,b
        return xp.reshape(blocks @ m, shape)
    post = math.prod(shape[ax + 1:])
    slabs = xp.reshape(x, (math.prod(shape[:ax]) * (shape[ax] // b), b, post))  # G,b,P
    return xp.reshape(xp.moveaxis(m, 0, 1) @ slabs, shape)


def rht_axis(shape: tuple[int, ...], block: int, axis: Any) -> int:
    """`axis` checked for a transform of an array of `shape` in blocks of `block`: an
    integer in [-ndim, ndim) along which the length is a multiple of the block.

    Raises
    ------
    TypeError
        If `axis` is not an integer.
    ValueError
        If it is out of range, or the block does not divide its length.
    """
    ax = check_int(axis, "axis")
    ndim = len(shape)
    if not -ndim <= ax < ndim:
        raise ValueError(f"axis must be in [-{ndim}, {ndim}); got {axis}")
    if shape[ax] % block:
        raise ValueError(f"x.shape[{ax}] = {shape[ax]} is not a multiple of block = {block}")
    return ax


def _apply(x: Any, block: int, seed: int, axis: int, inverse: bool) -> np.ndarray:
    arr = as_float_array(x, "x", min_ndim=1)
    m = rht_matrix(block, seed, inverse=inverse)
    ax = rht_axis(arr.shape, block, axis)
    work = NUMPY.work(arr)
    out: np.ndarray = rht_apply(work, m.astype(work.dtype), ax, xp=NUMPY)
    return out


def random_hadamard_transform(x: Any, block: int = 16, *, seed: int,
                              axis: int = -1) -> np.ndarray:
    """`x D H / sqrt(b)` in blocks of `block` along `axis` (see the module header).

    Parameters
    ----------
    x : array_like
        Float array; `x.shape[axis]` a multiple of `block`.
    block : int, optional
        The block size b, a power of two (16 in the NVFP4 recipe). Default 16.
    seed : int
        In [0, 2**64): the sign vector `d_j` comes from `splitmix64(seed + j)`.
    axis : int, optional
        The transformed axis. Default -1.

    Returns
    -------
    y : numpy.ndarray
        The dtype of `x` (float32 for float16/bfloat16 input), the shape of `x`.

    Raises
    ------
    TypeError
        If `x` is not a float array, or `block`, `seed` or `axis` is not an integer.
    ValueError
        If `block` is not a power of two or does not divide the axis, or `seed` or `axis`
        is out of range.

    Examples
    --------
    >>> y = random_hadamard_transform(np.eye(4)[0], block=4, seed=0)
    >>> np.abs(y).tolist()          # one spike spreads evenly over its block
    [0.5, 0.5, 0.5, 0.5]
    >>> inverse_random_hadamard_transform(y, block=4, seed=0).tolist()
    [1.0, 0.0, 0.0, 0.0]
    """
    return _apply(x, block, seed, axis, inverse=False)


def inverse_random_hadamard_transform(y: Any, block: int = 16, *, seed: int,
                                      axis: int = -1) -> np.ndarray:
    """The inverse `(y H / sqrt(b)) * d` of the transform, with the same seed.

    Undoes [random_hadamard_transform][normlab.precision.random_hadamard_transform].
    Exact in exact arithmetic (M is orthogonal); in floating point each output is one dot
    product of b terms, so x comes back to within a few ulps (exactly when every partial
    sum is representable, e.g. small integers with b = 16). Parameters and errors are those
    of the transform, with `y` in place of `x`.

    Examples
    --------
    >>> x = np.arange(16.0)
    >>> y = random_hadamard_transform(x, seed=7)
    >>> bool((inverse_random_hadamard_transform(y, seed=7) == x).all())
    True
    """
    return _apply(y, block, seed, axis, inverse=True)
