"""Fake quantisation of one GEMM operand: the values a low-precision GEMM would multiply.

Contract: every function takes a 2-D float32 tensor and returns a float32 tensor of the same
shape holding `dequantize(quantize(t))`, blocks along `axis` (the GEMM's contraction
dimension). These are adapters only: each calls the recipe's shared quantise and
dequantise steps ([normlab.precision.recipe_core][]) in the torch namespace, the same
functions behind [normlab.precision][]'s recipes and their torch twins, so an operand
equals the public function's dequantised result bit for bit. Dimension letters: M rows
(the Hadamard transform's axis), C columns.
"""

from __future__ import annotations

import torch

from normlab.precision import recipe_core as core
from normlab.precision.formats import Format
from normlab.precision.hadamard import rht_apply
from normlab.torch._fastround import round_elements
from normlab.torch.namespace import TORCH
from normlab.torch.nvfp4 import nvfp4_fake_quantize

__all__ = [
    "block_scaled",
    "hadamard_rows",
    "mx_blocks",
    "nvfp4",
    "per_tensor",
    "round_elements",
]


def per_tensor(t: torch.Tensor, fmt: Format, scale: torch.Tensor) -> torch.Tensor:
    """`sat_round(t * scale) * float32(1 / scale)` with one float32 scale (a 0-d tensor):
    an [Fp8Tensor][normlab.precision.Fp8Tensor] dequantised."""
    data, scale_inv = core.per_tensor_quantize(t, fmt, scale, xp=TORCH)
    return data * scale_inv


def mx_blocks(t: torch.Tensor, fmt: Format, axis: int, block_size: int = 32,
              rule: str = "ocp") -> torch.Tensor:
    """MX with blocks along `axis` (zero-padded): `mx_quantize(t, pad=True).dequantize()`."""
    elems, codes = core.mx_quantize_parts(t, fmt, block_size=block_size, axis=axis, rule=rule,
                                          xp=TORCH)
    return core.mx_dequantize_values(elems, codes, block_size=block_size, axis=axis, xp=TORCH)


def block_scaled(t: torch.Tensor, fmt: Format, axis: int, block: tuple[int, int], *,
                 power_of_2_scales: bool = False, epsilon: float = 0.0) -> torch.Tensor:
    """Blockwise FP8: `blockwise_quantize(...).dequantize()` with 1 x K tiles along `axis`
    (`block = (1, K)`) or K x K tiles of `t` (`block = (K, K)`, which ignore the axis)."""
    moved = t.movedim(axis, -1) if block[0] == 1 else t
    data, _, inv = core.blockwise_quantize_parts(moved, fmt, block=block, epsilon=epsilon,
                                                 power_of_2_scales=power_of_2_scales, xp=TORCH)
    out = core.blockwise_dequantize_values(data, inv, block=block, xp=TORCH)
    return out.movedim(-1, axis) if block[0] == 1 else out


def nvfp4(t: torch.Tensor, axis: int, *, two_d: bool, seed: int | None) -> torch.Tensor:
    """NVFP4: `nvfp4_quantize(t).dequantize()` with 1 x 16 blocks along `axis` (16 x 16
    tiles if `two_d`), stochastic elements when `seed` is given."""
    return nvfp4_fake_quantize(t, axis=-1 if two_d else axis,
                               block_shape=(16, 16) if two_d else None,
                               rounding="nearest" if seed is None else "stochastic", seed=seed)


def hadamard_rows(t: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """The random Hadamard transform along rows (axis 0) in blocks of 16, M zero-padded to a
    multiple of 16: `random_hadamard_transform(pad(t), 16, seed, axis=0)` for the `matrix`
    of that seed ([rht_matrix][normlab.precision.hadamard.rht_matrix] in float32).

    The map is orthogonal, so for two operands transformed alike `(H dy)^T (H x) = dy^T x`.
    """
    padded = torch.nn.functional.pad(t, (0, 0, 0, (-t.shape[0]) % 16))  # M',C
    return rht_apply(padded, matrix, 0, xp=TORCH)
