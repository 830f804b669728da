"""Random Hadamard transform (RHT) of tensors in blocks along an axis, and its inverse.

Dimension letters: N the transformed axis' length, b the block size, nB = N / b.

Contract: [normlab.precision.random_hadamard_transform][] on tensors: every block of b
elements along `axis` maps to `y = x D H_b / sqrt(b)` (inverse `(y H_b / sqrt(b)) * d`)
with the Sylvester H_b and the sign vector `d_j = 1 - 2 * (splitmix64(seed + j) >> 63)`,
identical to the NumPy side's. Each output is a b-term dot product computed by a
torch matmul; the NumPy side uses NumPy's matmul, whose summation order may differ, so
results agree to within the rounding of a b-term sum (and exactly when every partial sum
is representable, e.g. small integers). NVIDIA, "Pretraining Large Language Models with
NVFP4", 2025, sec. 4.2.
"""

from __future__ import annotations

from normlab._moved import renamed_arguments
from normlab.precision.scaled.hadamard import rht_apply, rht_axis, rht_matrix
from normlab.torch._import import torch
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["inverse_random_hadamard_transform", "random_hadamard_transform"]


def _apply(t: torch.Tensor, block: int, seed: int, axis: int, inverse: bool) -> torch.Tensor:
    t = check_tensor(t, "y" if inverse else "x")
    if t.dim() < 1:
        raise ValueError(f"{'y' if inverse else 'x'} must have at least one dimension; got "
                         f"shape {tuple(t.shape)}")
    m = rht_matrix(block, seed, inverse=inverse)  # b,b float64, the NumPy side's matrix
    ax = rht_axis(tuple(t.shape), block, axis)
    work = TORCH.work(t.detach())
    return rht_apply(work, torch.from_numpy(m).to(device=t.device, dtype=work.dtype), ax,
                     xp=TORCH)


@renamed_arguments(t="x")
def random_hadamard_transform(x: torch.Tensor, block: int = 16, *, seed: int,
                              axis: int = -1) -> torch.Tensor:
    """`x D H / sqrt(b)` in blocks of `block` along `axis` (see the module header).

    The NumPy twin [normlab.precision.random_hadamard_transform][] on a tensor, bit for
    bit: the same parameters (`x` a float tensor), the same errors.

    Returns
    -------
    y : torch.Tensor
        The dtype of `x` (float32 for float16/bfloat16 input), its shape, on its device.

    Examples
    --------
    >>> y = random_hadamard_transform(torch.eye(4)[0], block=4, seed=0)
    >>> y.abs().tolist()
    [0.5, 0.5, 0.5, 0.5]
    """
    return _apply(x, block, seed, axis, inverse=False)


@renamed_arguments(t="y")
def inverse_random_hadamard_transform(y: torch.Tensor, block: int = 16, *, seed: int,
                                      axis: int = -1) -> torch.Tensor:
    """The inverse `(y H / sqrt(b)) * d` of the transform, with the same seed.

    Undoes [random_hadamard_transform][normlab.torch.random_hadamard_transform]; parameters
    and errors are those of the transform.

    Examples
    --------
    >>> x = torch.arange(16.0)
    >>> y = random_hadamard_transform(x, seed=7)
    >>> bool((inverse_random_hadamard_transform(y, seed=7) == x).all())
    True
    """
    return _apply(y, block, seed, axis, inverse=True)
