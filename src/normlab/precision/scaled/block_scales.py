r"""The scale rules of the block-scaled recipes (MX, NVFP4, blockwise FP8), written once.

Each function maps block amaxes (on the block grid of [normlab.precision.scaled.tiling][]) to
the recipe's scales, in the namespace `xp` of its arrays ([normlab.precision.scaled.namespace][]),
so NumPy, torch on any device and the training layer compute them alike.

MX shared exponent (an E8M0 code $c = e + 127$, the scale $2^{e}$; code 255 is NaN), by
one of two rules on a block's amax:

- `"ocp"` (OCP Microscaling Formats spec v1.0, sec. 6.3):
  $e = \lfloor \log_2 \mathrm{amax} \rfloor - e_{max,elem}$, clamped to $\ge -127$ (an
  all-zero block gives code 0); $e > 127$, an infinity or a NaN give code 255.
- `"round_up"` (Transformer Engine's MXFP8 cast): $v = \mathrm{float32}(\mathrm{amax})
  \cdot \mathrm{float32}(1 / m_{elem})$ and the E8M0 code of $v$ rounded up: a nonzero
  float32 mantissa adds one to the exponent field, codes saturate at 254 ($2^{127}$, also
  for an infinite amax), $v \le 2^{-127}$ gives code 0, and a NaN gives 255.

NVFP4 two-level scales (Transformer Engine's NVFP4 cast, all in float32):
$S_{enc} = 2688 / \mathrm{amax}_t$ by
[scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] (1 when the tensor amax is
0, inf or NaN), $S_{dec} = 1 / S_{enc}$; per block
$s_b = \mathrm{e4m3}(\mathrm{amax}_b \cdot \mathrm{float32}(S_{enc} \cdot \mathrm{float32}(1/6)))$
(round to nearest, saturating at 448) and the element scale
$e_b = \min(1 / \mathrm{float32}(s_b S_{dec}), \mathrm{FLT\_MAX})$.

Blockwise FP8 (DeepSeek-V3; TE `Float8BlockScaling`): each block's scale is
[scale_from_amax][normlab.precision.scaled.scales.scale_from_amax] of its amax with the
recipe's epsilon and power-of-two flag; an overflowing quotient becomes the input dtype's
largest value (float32's for float32 and float64 input, bfloat16's or float16's for
those inputs), as TE's `compute_scale_from_types`.
"""

from __future__ import annotations

from typing import Any

from normlab.precision.formats.format import FLOAT8_E4M3FN, Format
from normlab.precision.scaled import scales
from normlab.precision.scaled.namespace import F32_MAX, ArrayNamespace, namespace_of

__all__ = ["MX_NAN_CODE", "MX_RULES", "blockwise_scales", "mx_scale_codes", "nvfp4_scales",
           "nvfp4_tensor_factors"]

MX_RULES = ("ocp", "round_up")
"""The two MX scale rules: the OCP spec's floor rule and Transformer Engine's round-up."""

MX_NAN_CODE = 255
"""The E8M0 code of a NaN scale."""

NVFP4_TENSOR_MAX = 448.0 * 6.0
"""E4M3's max times E2M1's max, the numerator of the NVFP4 tensor scale (2688)."""


def mx_scale_codes(amax: Any, elem_format: Format, rule: str, *,
                   xp: ArrayNamespace | None = None) -> Any:
    """The E8M0 code of each block's shared scale (rules in the module header).

    Parameters
    ----------
    amax : array
        Block amaxes (float32 or float64; NaN for a block holding a NaN).
    elem_format : Format
        The element format (its `emax` and `max` enter the rules).
    rule : {"ocp", "round_up"}
        The scale rule.
    xp : ArrayNamespace, optional
        The namespace of `amax` (default: inferred).

    Returns
    -------
    codes : array of int32
        `amax`'s shape, in [0, 254], or 255 for a NaN scale.

    Examples
    --------
    >>> from normlab.precision import get_format
    >>> amax = np.array([6.5, 0.0, np.inf])
    >>> mx_scale_codes(amax, get_format("fp4"), "ocp").tolist()
    [127, 0, 255]
    >>> mx_scale_codes(amax, get_format("fp4"), "round_up").tolist()
    [128, 0, 254]
    """
    xp = namespace_of(amax) if xp is None else xp
    with xp.quiet():
        if rule == "ocp":
            a = xp.astype(amax, "float64")
            exponent = ((xp.bits64(a) >> 52) & 0x7FF) - 1023  # floor(log2 a) for normal a
            e = xp.maximum(exponent - elem_format.emax, xp.scalar(-127, exponent))
            ok = xp.isfinite(a) & (e <= xp.scalar(127, e))  # zero, subnormals: clamped
            code = xp.where(ok, e + 127, xp.scalar(MX_NAN_CODE, e))
            return xp.astype(code, "int32")
        v = xp.astype(amax, "float32") * xp.scalar(1.0 / elem_format.max, amax, "float32")
        bits = xp.bits32(v)
        exponent = (bits >> 23) & 0xFF
        mantissa = bits & 0x7FFFFF
        bump = ((mantissa > 0) & (exponent != 0xFE)
                & ~((exponent == 0) & (mantissa <= 0x400000)))
        code = exponent + xp.astype(bump, "int32")
        code = xp.where(v == xp.scalar(0.0, v), xp.scalar(0, code), code)
        code = xp.where(xp.isinf(v), xp.scalar(0xFE, code), code)
        return xp.astype(xp.where(xp.isnan(v), xp.scalar(MX_NAN_CODE, code), code), "int32")


def nvfp4_scales(amax_blocks: Any, amax_tensor: Any, *,
                 xp: ArrayNamespace | None = None) -> tuple[Any, Any, Any]:
    """NVFP4's block scales, element scales and tensor decode scale (module header).

    Parameters
    ----------
    amax_blocks : array
        Block amaxes (any float dtype; rounded to float32).
    amax_tensor : array
        The tensor amax, 0-d (rounded to float32).
    xp : ArrayNamespace, optional
        The namespace (default: inferred from `amax_blocks`).

    Returns
    -------
    block_scales : array of float32
        $s_b$, values of E4M3 (NaN for a NaN block), `amax_blocks`' shape.
    element_scales : array of float32
        $e_b$, the factor the block's elements are multiplied by before rounding.
    s_dec : array of float32
        $S_{dec}$, 0-d.

    Examples
    --------
    >>> s_b, e_b, s_dec = nvfp4_scales(np.float32([7.5]), np.float32(7.5))
    >>> s_b.tolist(), e_b.tolist()   # S_enc = 2688 / 7.5 = 358.4
    ([448.0], [0.800000011920929])
    """
    xp = namespace_of(amax_blocks) if xp is None else xp
    with xp.quiet():
        s_mul, s_dec = nvfp4_tensor_factors(amax_tensor, xp=xp)
        # TE's order (compute_decoding_scaling_factor): amax_b * float32(S_enc * (1/6))
        s_b = xp.astype(amax_blocks, "float32") * s_mul
        block_scales = xp.astype(xp.quantize(s_b, FLOAT8_E4M3FN, saturate=True), "float32")
        one = xp.scalar(1.0, s_dec)
        element_scales = xp.minimum(one / (block_scales * s_dec), xp.scalar(F32_MAX, s_dec))
        return block_scales, element_scales, s_dec


def nvfp4_tensor_factors(amax_tensor: Any, *, xp: ArrayNamespace) -> tuple[Any, Any]:
    """NVFP4's tensor-level factors, 0-d float32: `(float32(S_enc * float32(1/6)), S_dec)`,
    the multiplier of the block amaxes and the tensor decode scale (module header); the
    per-block steps of [nvfp4_scales][normlab.precision.scaled.block_scales.nvfp4_scales] follow
    from them (its compiled twin takes them as they are)."""
    with xp.quiet():
        s_enc = scales.scale_from_amax(amax_tensor, NVFP4_TENSOR_MAX, xp=xp)  # 0-d float32
        s_dec = xp.scalar(1.0, s_enc) / s_enc
        return s_enc * xp.scalar(1.0 / 6.0, s_enc), s_dec


def blockwise_scales(amax: Any, fmt: Format, *, epsilon: float = 0.0,
                     power_of_2_scales: bool = False, value_for_inf: float = F32_MAX,
                     nonfinite_nan: bool = False, xp: ArrayNamespace | None = None) -> Any:
    """Blockwise FP8's float32 scale per block (module header).

    Parameters
    ----------
    amax : array
        Block amaxes.
    fmt : Format
        The FP8 format (its `max` is the numerator).
    epsilon : float, optional
        Lower bound on each amax. Default 0.
    power_of_2_scales : bool, optional
        Round each scale down to a power of two. Default False.
    value_for_inf : float, optional
        The scale where the quotient overflows: the input dtype's largest value.
    nonfinite_nan : bool, optional
        A block whose amax is inf or NaN gets a NaN scale, so its values become NaN
        (torchao's rowwise cast), instead of 1 (saturating, Transformer Engine's). Default
        False.
    xp : ArrayNamespace, optional
        The namespace (default: inferred).

    Returns
    -------
    scales : array of float32
        `amax`'s shape; 1 for blocks whose amax is 0 (with `epsilon` 0), inf or NaN (NaN
        for the last two with `nonfinite_nan`).

    Examples
    --------
    >>> from normlab.precision import get_format
    >>> blockwise_scales(np.float32([4.0, 0.0]), get_format("e4m3")).tolist()
    [112.0, 1.0]
    """
    xp = namespace_of(amax) if xp is None else xp
    previous = xp.scalar(float("nan"), amax) if nonfinite_nan else None
    return scales.scale_from_amax(amax, fmt.max, epsilon=epsilon,
                                  power_of_2_scales=power_of_2_scales, previous=previous,
                                  value_for_inf=value_for_inf, xp=xp)
