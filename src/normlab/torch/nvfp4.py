r"""NVFP4 on tensors: E2M1 elements, E4M3 scales per block of 16, one float32 tensor scale.

Dimension letters: N the blocked axis (1-D blocks), R, C the last two axes (2-D blocks).

Contract: [normlab.precision.nvfp4_quantize][] bit for bit, on any device, because both
run [nvfp4_quantize_parts][normlab.precision.scaled.arithmetic.nvfp4_quantize_parts] (the
two-level scales of [nvfp4_scales][normlab.precision.scaled.block_scales.nvfp4_scales], in
float32 as Transformer Engine's cast) through their array namespace; elements are rounded
to nearest or stochastically (element i of x's flattened C order uses
`splitmix64(seed + i)`, as [normlab.torch.quantize][]). This module validates arguments
and holds tensors. NVIDIA, "Pretraining Large Language Models with NVFP4", 2025, sec. 2
and app. B.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._moved import renamed_arguments
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.nvfp4 import NVFP4Tensor, check_nvfp4_args
from normlab.torch._import import torch
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor, seed_from_rng

__all__ = ["NVFP4Tensor", "nvfp4_fake_quantize", "nvfp4_quantize"]


def _checked(t: Any, axis: Any, block_shape: Any, rounding: Any,
             tensor_amax: Any) -> tuple[torch.Tensor, int, tuple[int, ...], torch.Tensor | None]:
    """Validated (t, axis in [0, t.dim()), block, tensor amax as a 0-d float64 tensor or
    None for max |t|)."""
    t = check_tensor(t)
    if t.dim() < 1:
        raise ValueError(f"x must have at least one dimension; got shape {tuple(t.shape)}")
    given = tensor_amax if isinstance(tensor_amax, torch.Tensor) else None  # taken as is
    ax, block, v = check_nvfp4_args(t.dim(), axis, block_shape, rounding,
                                    None if given is not None else tensor_amax)
    amax_t: torch.Tensor | None = None  # None: max |t|
    if given is not None:
        amax_t = given.detach().reshape(()).to(device=t.device, dtype=torch.float64)
    elif v is not None:
        amax_t = torch.tensor(v, dtype=torch.float64, device=t.device)
    return t, ax, block, amax_t


@renamed_arguments(t="x")
def nvfp4_quantize(
    x: torch.Tensor,
    *,
    axis: int = -1,
    block_shape: tuple[int, int] | None = None,
    rounding: str = "nearest",
    rng: np.random.Generator | None = None,
    tensor_amax: Any = None,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> NVFP4Tensor:
    """Quantise `x` to NVFP4 (two-level scaling; formulas in the module header).

    Parameters
    ----------
    x : torch.Tensor
        Float tensor, at least 1-D (2-D for `block_shape=(16, 16)`).
    axis : int, optional
        The blocked axis of 1-D blocks (-1, the default, with 2-D blocks).
    block_shape : tuple of two ints or None, optional
        None (the default: 1 x 16 along `axis`) or a 2-tuple such as (16, 16).
    rounding : {"nearest", "stochastic"}, optional
        How the elements are rounded (the scales always round to nearest). Default
        "nearest".
    rng : numpy.random.Generator, optional
        Randomness for "stochastic": one seed drawn as the NumPy twin draws it (see
        [quantize][normlab.torch.quantize]).
    tensor_amax : float or torch.Tensor, optional
        A float >= 0 or a 0-d tensor (e.g. all-reduced over ranks); None (the default)
        takes `max |x|`.
    seed, random_bits : int or torch.Tensor, optional
        Randomness for "stochastic": exactly one of `rng`, `seed` and `random_bits`.

    Returns
    -------
    q : NVFP4Tensor
        On the device of `x`, equal to the NumPy twin
        [normlab.precision.nvfp4_quantize][] bit for bit.

    Raises
    ------
    TypeError
        As the NumPy twin.
    ValueError
        As the NumPy twin.

    Examples
    --------
    >>> q = nvfp4_quantize(torch.arange(16.0) / 2)
    >>> q.block_scales.tolist(), q.elements[:4].tolist()
    ([448.0], [0.0, 0.5, 1.0, 1.0])
    """
    x, ax, block, amax_t = _checked(x, axis, block_shape, rounding, tensor_amax)
    seed = seed_from_rng(rounding == "stochastic", rng, seed, random_bits, x)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        x.detach(), block=block, axis=ax, amax_tensor=amax_t, rounding=rounding, seed=seed,
        random_bits=random_bits, xp=TORCH)
    return NVFP4Tensor(elems, scales, s_dec, block, ax)


def nvfp4_fake_quantize(
    t: torch.Tensor,
    *,
    axis: int = -1,
    block_shape: tuple[int, int] | None = None,
    rounding: str = "nearest",
    tensor_amax: Any = None,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """`nvfp4_quantize(t, ...).dequantize()`, bit for bit, without building the container.

    Formula: `e2m1(x * e_b) * s_b * S_dec` elementwise, in float32 (the product order of
    [NVFP4Tensor.dequantize][normlab.torch.NVFP4Tensor.dequantize]). Parameters and
    errors are those of [nvfp4_quantize][normlab.torch.nvfp4_quantize].

    Returns
    -------
    out : torch.Tensor
        Float32, the shape and device of `t`.

    Examples
    --------
    >>> x = torch.linspace(-3.0, 3.0, 32)
    >>> torch.equal(nvfp4_fake_quantize(x), nvfp4_quantize(x).dequantize())
    True
    """
    t, ax, block, amax_t = _checked(t, axis, block_shape, rounding, tensor_amax)
    elems, scales, s_dec = core.nvfp4_quantize_parts(
        t.detach(), block=block, axis=ax, amax_tensor=amax_t, rounding=rounding, seed=seed,
        random_bits=random_bits, xp=TORCH)
    return core.nvfp4_dequantize_values(elems, scales, s_dec, block=block, axis=ax, xp=TORCH)
