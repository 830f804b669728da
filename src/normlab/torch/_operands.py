"""Fake quantisation of one GEMM operand: the values a low-precision GEMM would multiply.

Contract: every function takes a 2-D tensor (float32, or the model's bfloat16 or float16,
taken as its float32 value) and returns a float32 tensor of the same shape holding
`dequantize(quantize(t))`, blocks along `axis` (the GEMM's contraction dimension). These
are adapters only: each names its recipe's [OperandSpec][normlab.precision.operands.OperandSpec]
and calls the custom op of `normlab.torch._operand_ops`, which runs the recipe's shared
quantise and dequantise steps ([normlab.precision.recipe_core][]) through the numba
kernels on CPU tensors and through the torch namespace elsewhere, so an operand equals
the public function's dequantised result bit for bit.
"""

from __future__ import annotations

import torch

from normlab.precision.formats import FLOAT4_E2M1FN, Format
from normlab.precision.operands import OperandSpec
from normlab.torch import _operand_ops as opaque

__all__ = ["block_scaled", "mx_blocks", "nvfp4", "per_tensor", "rounded"]


def rounded(t: torch.Tensor, fmt: Format) -> torch.Tensor:
    """`quantize(t, fmt)` to nearest even, no scale (the Bf16 recipe)."""
    return opaque.fake(t, OperandSpec("round", fmt))


def per_tensor(t: torch.Tensor, fmt: Format, scale: torch.Tensor) -> torch.Tensor:
    """`sat_round(t * scale) * float32(1 / scale)` with one float32 scale (a 0-d tensor):
    an [Fp8Tensor][normlab.precision.Fp8Tensor] dequantised."""
    return opaque.fake(t, OperandSpec("tensor", fmt), scale=scale)


def mx_blocks(t: torch.Tensor, fmt: Format, axis: int, block_size: int = 32,
              rule: str = "ocp") -> torch.Tensor:
    """MX with blocks along `axis` (zero-padded): `mx_quantize(t, pad=True).dequantize()`."""
    return opaque.fake(t, OperandSpec("mx", fmt, axis, block_size, rule=rule))


def block_scaled(t: torch.Tensor, fmt: Format, axis: int, block: tuple[int, int], *,
                 power_of_2_scales: bool = False, epsilon: float = 0.0) -> torch.Tensor:
    """Blockwise FP8: `blockwise_quantize(...).dequantize()` with 1 x K tiles along `axis`
    (`block = (1, K)`) or K x K tiles of `t` (`block = (K, K)`, which ignore the axis)."""
    spec = OperandSpec("block", fmt, axis, block[1], tile=block[0] != 1,
                       pow2=power_of_2_scales, epsilon=epsilon)
    return opaque.fake(t, spec)


def nvfp4(t: torch.Tensor, axis: int, *, two_d: bool, step: torch.Tensor | None = None,
          stream: int = 0, which: int = 0,
          hadamard: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4: `nvfp4_quantize(t).dequantize()` with 1 x 16 blocks along `axis` (16 x 16
    tiles if `two_d`); stochastic elements with the stream of (`stream`, `step`, `which`)
    when `step` is given; rows through the random Hadamard transform `hadamard` first
    (zero-padded to a multiple of 16) when it is given."""
    spec = OperandSpec("nvfp4", FLOAT4_E2M1FN, axis, 16, tile=two_d)
    return opaque.fake(t, spec, step=step, stream=stream, which=which, hadamard=hadamard)
