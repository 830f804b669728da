r"""A training GEMM in bfloat16 on operand values that bfloat16 holds exactly.

Dimension letters: R, C an operand's rows and columns; a GEMM `op(a) @ op(b)` contracts
one of them.

Contract. A GEMM operand's fake-quantised values (float32, `normlab.torch._operands`)
factor as $v = e \cdot f$: elements $e$ (the format's element times any block scale that
varies along the contraction) and one float32 factor $f$ per tensor (FP8's inverse scale,
NVFP4's $S_{dec}$; none for the Bf16 recipe, MX and power-of-two blockwise FP8). When
every $e$ is a bfloat16 value, [gemm][normlab.torch.training._bf16_gemm.gemm] multiplies the
elements as bfloat16 in one GEMM, accumulated in float32, and applies $f_a f_b$ to the
float32 result (the scaled GEMM of FP8 hardware). Which operands qualify:

| operand | element x varying scale | significand bits | factor |
|---|---|---|---|
| Bf16 recipe (bf16) | bf16 | 8 | none |
| FP8 per tensor | E4M3 / E5M2 | 4 / 3 | `1 / scale` |
| MX | element x E8M0 (a power of two) | <= 4 | none |
| NVFP4 | E2M1 x E4M3 block scale | 2 + 4 = 6 | $S_{dec}$ |
| blockwise FP8, power-of-two scales | E4M3 x 2^k | 4 | none |
| blockwise FP8, float32 scales | E4M3 x float32 | up to 24 | - (exact path) |
| Bf16 recipe with float16 | float16 | 11 | - (exact path) |

bfloat16 has 8 significand bits and float32's exponent range, so a product of two
significands of p and q bits (p + q <= 8) is a bfloat16 value, unless it falls below
2^-126, where bfloat16's subnormals keep only the bits down to 2^-133 (a value there
needs a block amax below about 2^-117). The elements are recovered from the values as
`bfloat16(v / f)`: `v / f` is within 2^-23 (relative) of $e$, and $e$ has at most 8
significand bits, so rounding to bfloat16 returns $e$ exactly.

Blockwise FP8 with float32 scales has no exact one-GEMM form in bfloat16: its scale varies
along K (one per 128 elements of a row of x, per 128 x 128 tile of W) so it cannot be
applied to the result, and an E4M3 value times a float32 scale needs up to 4 + 24 bits.
The exact alternatives cost more than the float32 GEMM they would replace: one bfloat16
GEMM per K block with the partial products scaled and summed in float32 (K / 128 GEMMs
whose outputs torch's CPU GEMM rounds to bfloat16, one rounding per block instead of one
per output), or three bfloat16 terms per value (up to nine GEMMs).

The bound. torch's CPU bfloat16 GEMM (oneDNN; `vdpbf16ps` or AMX where the CPU has them)
forms the exact products, accumulates them in float32 and rounds the result once to
bfloat16 (checked in the tests: on operands whose float32 sums are exact it returns
`bfloat16(exact)` bit for bit). Against the exact path, the float32 GEMM of the values,
an output element $y$ differs by that rounding and by float32 accumulation in another
order:

$$
|y_{bf16} - y_{exact}| \le u\,|y_{exact}| + 2 (K + 2)\,\epsilon_{32}\,(|a|\,|b|)
$$

with $u = 2^{-8}$, half a bfloat16 unit in the last place relative (so at most one unit
of $y$), $\epsilon_{32} = 2^{-23}$ and $|a||b|$ the product of the operands' absolute
values. A bfloat16 model casts both to bfloat16, where they differ by at most one unit.
Select the exact path with `exact_gemm=True` ([QuantLinear][normlab.torch.QuantLinear],
[convert][normlab.torch.training.convert.convert]) for bit-identical emulation.

The GEMM is a custom op, opaque to `torch.compile`, like the exact path's
([normlab.torch.training._product_ops][]): compiled runs give eager's bits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from normlab.precision.formats.format import BFLOAT16, FLOAT8_E4M3FN
from normlab.precision.scaled.block_scales import nvfp4_tensor_factors
from normlab.precision.scaled.quantizers import (
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    MXQuantizer,
    NVFP4Quantizer,
    Quantizer,
    RoundQuantizer,
)
from normlab.torch.namespace import TORCH
from normlab.torch.training import _operand_ops as opaque

__all__ = ["GemmOperand", "exact_in_bf16", "gemm", "uses_bf16"]

_BF16_BITS = BFLOAT16.mantissa_bits + 1  # 8 significand bits
_F32_BITS = 24


@dataclass(frozen=True)
class GemmOperand:
    """One GEMM operand: its fake-quantised values and what made them.

    Attributes
    ----------
    values : torch.Tensor
        The float32 values the exact path multiplies, shape (R, C).
    quantizer : Quantizer
        How they were quantised (the layer's quantizer for the operand's dtype).
    source : torch.Tensor or None
        The tensor quantised (x, W or dy in the model's dtype), where the per-tensor factor
        is computed from it (NVFP4's tensor amax); None for a saved operand.
    scale : torch.Tensor or None
        The 0-d float32 scale of a per-tensor kind (FP8), as the operand used it.
    hadamard : torch.Tensor or None
        NVFP4's 16 x 16 transform, where the operand's rows went through it.
    parts : tuple of torch.Tensor or None
        An encoded operand's (codes, scales, tensor scale), for a saved operand.
    """

    values: torch.Tensor
    quantizer: Quantizer
    source: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    hadamard: torch.Tensor | None = None
    parts: tuple[torch.Tensor, ...] | None = None


def _inverse_scale(op: GemmOperand) -> torch.Tensor:
    """FP8 per tensor: `float32(1 / scale)`, the dequantisation factor (`scale_inv`)."""
    if op.parts is not None:
        return op.parts[1]  # the saved operand's scale_inv
    assert op.scale is not None, "a per-tensor operand needs its scale"
    return 1.0 / op.scale.to(torch.float32)


def _nvfp4_s_dec(op: GemmOperand) -> torch.Tensor:
    """NVFP4: $S_{dec}$ of the tensor amax (of the transformed rows, where transformed)."""
    if op.parts is not None:
        return op.parts[2]  # the saved operand's tensor scale
    assert op.source is not None, "an NVFP4 operand needs its source or its parts"
    if op.hadamard is not None:  # the transform inside the opaque encode op, as the values'
        # (outside an op, torch.compile may form the transform's products otherwise)
        return opaque.encode(op.source, op.quantizer, hadamard=op.hadamard)[2]
    return nvfp4_tensor_factors(opaque.tensor_amax(op.source), xp=TORCH)[1]


@functools.singledispatch
def _scale_bits(q: Quantizer) -> int | None:
    """Significand bits of the scale that varies along the contraction (0: none varies);
    None for a family this GEMM does not know: its operands keep the float32 GEMM."""
    return None


@_scale_bits.register
def _(q: RoundQuantizer) -> int | None:
    return 0


@_scale_bits.register
def _(q: Fp8TensorQuantizer) -> int | None:
    return 0  # one scale for the tensor: a factor of the result


@_scale_bits.register
def _(q: MXQuantizer) -> int | None:
    return 1  # E8M0: a power of two


@_scale_bits.register
def _(q: NVFP4Quantizer) -> int | None:
    return FLOAT8_E4M3FN.mantissa_bits + 1  # the E4M3 block scale


@_scale_bits.register
def _(q: Fp8BlockQuantizer) -> int | None:
    return 1 if q.pow2 else _F32_BITS


@functools.singledispatch
def _tensor_factor(q: Quantizer, op: GemmOperand) -> torch.Tensor | None:
    """The operand's per-tensor factor (None: 1)."""
    return None


@_tensor_factor.register
def _(q: Fp8TensorQuantizer, op: GemmOperand) -> torch.Tensor | None:
    return _inverse_scale(op)


@_tensor_factor.register
def _(q: NVFP4Quantizer, op: GemmOperand) -> torch.Tensor | None:
    return _nvfp4_s_dec(op)


def exact_in_bf16(quantizer: Quantizer) -> bool:
    """Whether every element of an operand of `quantizer` (its element times the scale that
    varies along the contraction, the per-tensor factor taken out) is a bfloat16 value.

    Parameters
    ----------
    quantizer : Quantizer
        How the operand is quantised.

    Returns
    -------
    exact : bool
        True when the element's and the varying scale's significand bits add up to at most
        bfloat16's 8 and the element format's range lies within bfloat16's.

    Examples
    --------
    >>> from normlab.precision.scaled.recipes import BlockwiseFp8Recipe, NVFP4Recipe
    >>> exact_in_bf16(NVFP4Recipe().quantizer("x", 1))
    True
    >>> exact_in_bf16(BlockwiseFp8Recipe().quantizer("x", 1))
    False
    """
    varying = _scale_bits(quantizer)
    if varying is None:
        return False
    fmt = quantizer.fmt
    return fmt.mantissa_bits + 1 + varying <= _BF16_BITS and fmt.emax <= BFLOAT16.emax


def uses_bf16(a: GemmOperand, b: GemmOperand, dtypes: tuple[torch.dtype, ...], *,
              exact_gemm: bool) -> bool:
    """Whether the GEMM of `a` and `b` runs in bfloat16: a bfloat16 model (every dtype of
    `dtypes`, the layer's input and weight, is bfloat16), `exact_gemm` off, and both
    operands exact in bfloat16
    ([exact_in_bf16][normlab.torch.training._bf16_gemm.exact_in_bf16])."""
    return (not exact_gemm and all(d == torch.bfloat16 for d in dtypes)
            and exact_in_bf16(a.quantizer) and exact_in_bf16(b.quantizer))


def _factor(op: GemmOperand) -> torch.Tensor | None:
    """The operand's per-tensor factor, float32 of shape (1,) (None: 1); 0, inf or NaN count as 1
    (an all-zero tensor's factor divides nothing then)."""
    f = _tensor_factor(op.quantizer, op)
    if f is None:
        return None
    f = f.to(torch.float32).reshape(1)  # 1-D: it sets the dtype of the ops it enters
    return torch.where(torch.isfinite(f) & (f != 0), f, torch.ones_like(f))


def _unconverted(op: GemmOperand, factor: torch.Tensor | None) -> torch.Tensor:
    """What the GEMM converts: the bfloat16 source itself where the operand is its rounding
    to bfloat16 with no scale (the Bf16 recipe: the identity on a bfloat16 tensor, so no
    conversion pass), else the values."""
    src = op.source
    if (src is not None and src.dtype == torch.bfloat16 and op.quantizer.fmt == BFLOAT16
            and factor is None and op.hadamard is None and src.shape == op.values.shape
            and _scale_bits(op.quantizer) == 0):
        return src
    return op.values


def _elements(values: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """`bfloat16(values / factor)` in one pass (a float32 quotient rounded on the way out,
    exact: module header), in the values' layout; bfloat16 values as they are."""
    if factor is None:
        return values.to(torch.bfloat16)
    return torch.div(values, factor, out=torch.empty_like(values, dtype=torch.bfloat16))


@torch.library.custom_op("normlab::bf16_gemm", mutates_args=())
def _bf16_gemm_op(a: torch.Tensor, b: torch.Tensor, a_factor: torch.Tensor | None,
                  b_factor: torch.Tensor | None, bias: torch.Tensor | None, trans_a: bool,
                  trans_b: bool, out_dtype: torch.dtype) -> torch.Tensor:
    ea, eb = _elements(a, a_factor), _elements(b, b_factor)
    y = (ea.t() if trans_a else ea) @ (eb.t() if trans_b else eb)  # bfloat16, rounded once
    factors = [f for f in (a_factor, b_factor) if f is not None]
    f = (factors[0] * factors[1] if len(factors) == 2 else factors[0]) if factors else None
    if f is None and bias is None:
        return y.to(out_dtype)
    out = y.to(torch.float32)  # the factors and the bias in float32, in place
    if f is not None:
        out.mul_(f)
    if bias is not None:
        out.add_(bias.to(torch.float32))
    return out.to(out_dtype)


@_bf16_gemm_op.register_fake
def _(a, b, a_factor, b_factor, bias, trans_a, trans_b, out_dtype):
    rows = a.shape[1] if trans_a else a.shape[0]
    cols = b.shape[0] if trans_b else b.shape[1]
    return a.new_empty((rows, cols), dtype=out_dtype)


def gemm(a: GemmOperand, b: GemmOperand, bias: torch.Tensor | None = None, *,
         trans_a: bool = False, trans_b: bool = False,
         out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`op(a) @ op(b) (+ bias)` as one bfloat16 GEMM of the operands' elements, float32
    accumulation, the per-tensor factors and the bias applied in float32 (module header).

    Parameters
    ----------
    a, b : GemmOperand
        The operands, each exact in bfloat16 (`exact_in_bf16` of its quantizer).
    bias : torch.Tensor or None, optional
        Added to each row in float32, shape (N,).
    trans_a, trans_b : bool, optional
        Transpose the operand first (inside: the GEMM sees the operands' own strides).
    out_dtype : torch.dtype, optional
        The result's dtype. Default float32; a narrower one takes the float32 result
        rounded once (in the same pass that applies the factors and the bias).

    Returns
    -------
    out : torch.Tensor
        Within the module header's bound of the exact path's float32 GEMM (then cast to
        `out_dtype`).

    Raises
    ------
    ValueError
        If an operand is not exact in bfloat16.
    """
    for name, op in (("a", a), ("b", b)):
        if not exact_in_bf16(op.quantizer):
            raise ValueError(f"{name} must be exact in bfloat16 (element and varying scale "
                             f"within 8 significand bits); got the operand kind "
                             f"{op.quantizer.key()!r}: use the float32 GEMM")
    fa, fb = _factor(a), _factor(b)
    return _bf16_gemm_op(_unconverted(a, fa), _unconverted(b, fb), fa, fb, bias, trans_a,
                         trans_b, out_dtype)
