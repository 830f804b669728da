"""Block tiling and padding of the block-scaled recipes, written once for every backend.

Dimension letters: A the leading axes of x flattened, R and C the blocked axes' lengths
(R = 1 for 1-D blocks), r x c a block's shape (r = 1 for 1-D blocks),
nR = ceil(R / r), nC = ceil(C / c).

A block shape covers the trailing axes of x: `(c,)` blocks the last axis in runs of c,
`(r, c)` the last two axes in r-by-c tiles. Lengths that are not a multiple of the block
are padded with zeros for the block statistics (a zero changes no amax); per-block values
come back to x's shape by a gather, so every element-shaped result has x's shape exactly.
Per-block values live on the *block grid*: `lead + (nR, nC)` for 2-D blocks, `lead + (nC,)`
for 1-D blocks, `lead` being x's leading axes.

Every function takes the arrays' namespace `xp` ([normlab.precision.scaled.namespace][]), so
the NumPy recipes, their torch twins and the training layer tile alike; on NumPy,
[block_amax][normlab.precision.scaled.tiling.block_amax] runs the numba kernel `"block_amax"`
where it serves the input.
"""

from __future__ import annotations

import math
from typing import Any

from normlab._validate import check_int
from normlab.precision.scaled.namespace import ArrayNamespace, namespace_of

__all__ = [
    "block_amax",
    "check_block_shape",
    "grid_shape",
    "scale_blocks",
    "spread",
    "tile",
]


def check_block_shape(block_shape: Any, ndim: int, name: str = "block_shape") -> tuple[int, ...]:
    """A validated block shape: a tuple of 1 or 2 positive ints, no longer than x's ndim.

    Parameters
    ----------
    block_shape : tuple or list of int
        The caller's block shape.
    ndim : int
        The number of axes of x.
    name : str, optional
        The argument's name in error messages.

    Returns
    -------
    block : tuple of int
        The block shape.

    Raises
    ------
    ValueError
        If it is not one or two positive ints, or blocks more axes than x has.
    """
    if not isinstance(block_shape, (tuple, list)) or len(block_shape) not in (1, 2):
        raise ValueError(f"{name} must be a tuple of one or two positive ints; got "
                         f"{block_shape!r}")
    shape = tuple(check_int(b, name, minimum=1) for b in block_shape)
    if len(shape) > ndim:
        raise ValueError(f"{name} {shape} blocks {len(shape)} axes but x has only {ndim}")
    return shape


def _dims(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """(A, R, C, r, c, nR, nC) of x's shape under `block`."""
    lead, tail = shape[: len(shape) - len(block)], shape[len(shape) - len(block):]
    R, C = tail if len(tail) == 2 else (1, tail[0])
    r, c = block if len(block) == 2 else (1, block[0])
    return math.prod(lead), R, C, r, c, -(-R // r), -(-C // c)


def grid_shape(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """The block grid's shape: `lead + (nR, nC)` (2-D blocks) or `lead + (nC,)` (1-D).

    Examples
    --------
    >>> grid_shape((3, 40, 72), (16, 16)), grid_shape((3, 72), (32,))
    ((3, 3, 5), (3, 3))
    """
    _, _, _, _, _, nR, nC = _dims(tuple(shape), block)
    lead = tuple(shape[: len(shape) - len(block)])
    return (*lead, nR, nC) if len(block) == 2 else (*lead, nC)


def tile(x: Any, block: tuple[int, ...], *, xp: ArrayNamespace | None = None) -> Any:
    """x zero-padded and reshaped to tiles, shape (A, nR, r, nC, c).

    A view of x when no padding is needed and x's layout allows it.
    """
    xp = namespace_of(x) if xp is None else xp
    A, R, C, r, c, nR, nC = _dims(tuple(x.shape), block)
    a = xp.pad_end(xp.reshape(x, (A, R, C)), (0, nR * r - R, nC * c - C))  # A,nR*r,nC*c
    return xp.reshape(a, (A, nR, r, nC, c))


def _block_amax_reference(x: Any, block: tuple[int, ...]) -> Any:
    return block_amax(x, block, xp=namespace_of(x), accelerate=False)


def block_amax(x: Any, block: tuple[int, ...], *, xp: ArrayNamespace | None = None,
               accelerate: bool = True) -> Any:
    """max |x| over each block, on the block grid; +NaN for a block holding a NaN.

    Parameters
    ----------
    x : array
        Any float dtype (16-bit floats are widened to float32: a max is exact in any dtype).
    block : tuple of int
        A block shape (see the module header).
    xp : ArrayNamespace, optional
        The namespace of `x` (default: inferred).
    accelerate : bool, optional
        Let NumPy run the numba kernel `"block_amax"` (the same values). Default True.

    Returns
    -------
    amax : array
        The block grid's shape; x's work dtype (float64 for float64 x, else float32), or
        the kernel's dtype (x's), holding the same values.

    Examples
    --------
    >>> block_amax(np.array([[1.0, -3.0, 2.0]], np.float32), (2,)).tolist()
    [[3.0, 2.0]]
    """
    xp = namespace_of(x) if xp is None else xp
    if accelerate:
        return xp.dispatch("block_amax", _block_amax_reference, x, block)
    m = xp.max(xp.abs(tile(xp.work(x), block, xp=xp)), axis=(2, 4))  # A,nR,nC
    # abs again: a reduction may hand back a NaN with its sign bit set
    return xp.reshape(xp.abs(m), grid_shape(tuple(x.shape), block))


def spread(grid: Any, block: tuple[int, ...], shape: tuple[int, ...], *,
           xp: ArrayNamespace | None = None) -> Any:
    """Each grid value repeated over its block: an array of x's `shape`.

    A gather of the grid with the block index of every row and column
    (`index // block`), so no padded intermediate is cropped: `torch.compile`'s CPU code
    generator (torch 2.13) computes wrong addresses for a pointwise operation on a crop
    of a reshaped broadcast, which this form never builds.

    Examples
    --------
    >>> spread(np.array([1.0, 2.0]), (2,), (3,)).tolist()
    [1.0, 1.0, 2.0]
    """
    xp = namespace_of(grid) if xp is None else xp
    out = grid
    for k, b in enumerate(block):
        ax = len(shape) - len(block) + k
        out = xp.take(out, xp.arange(shape[ax], grid) // b, ax)
    return out


def scale_blocks(x: Any, grid: Any, block: tuple[int, ...], *,
                 xp: ArrayNamespace | None = None) -> Any:
    """`x * v` with each block's grid value `v`, one IEEE product per element, x's shape.

    `grid` must have x's dtype, so the product is rounded once in that dtype.
    """
    xp = namespace_of(x) if xp is None else xp
    return x * spread(grid, block, tuple(x.shape), xp=xp)
