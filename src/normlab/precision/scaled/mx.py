r"""MX block quantisation: blocks of k elements along an axis share one E8M0 scale.

Contract: a block $V_1..V_k$ (k = `block_size`, 32 in the OCP formats) is stored as a
power-of-two scale $X = 2^e$ (an E8M0 code $e + 127$, $e \in [-127, 127]$, code 255 =
NaN) and elements $P_i = \mathrm{sat\_round}(V_i / X)$ in the element format (E4M3, E5M2,
E3M2, E2M3, E2M1 or any Format), rounded to nearest even with saturation to $\pm$max.
Decoding is $X \cdot P_i$.

Two rules choose e from the block's amax = max |V_i|
([mx_scale_codes][normlab.precision.scaled.block_scales.mx_scale_codes] states both, shared
with the torch twin and the training layer):

- `"ocp"` (OCP Microscaling Formats spec v1.0, sec. 6.3):
  $e = \lfloor \log_2 \mathrm{amax} \rfloor - e_{max,elem}$ ($e_{max,elem}$ = exponent
  of the element format's largest binade: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3
  and E2M1), clamped to $\ge -127$; $e > 127$ gives a NaN scale. Elements between max and
  $2^{e_{max}+1}$ times X are clipped to max (the rule's known saturation).
- `"round_up"` (Transformer Engine's MXFP8 cast): X is the smallest power of two with
  $\mathrm{amax} / X \le m_{elem}$, computed as TE does in float32:
  $v = \mathrm{float32}(\mathrm{amax}) \cdot \mathrm{float32}(1 / m_{elem})$, then the E8M0
  code of v rounded up (a nonzero fp32 mantissa adds one to the exponent; codes saturate
  at 254 = $2^{127}$; $v \le 2^{-127}$ gives code 0). For normal float32 amax this equals
  the exact $\lceil \log_2(\mathrm{amax} / m_{elem}) \rceil$ because
  $\mathrm{float32}(1/m_{elem})$ is above $1/m_{elem}$ by less than half an ulp for these
  formats.

Special blocks: all zeros -> code 0 ($2^{-127}$) and zero elements, under both rules. A
NaN anywhere in a block -> NaN scale (code 255) and every element NaN (a NaN scale decodes
the whole block as NaN in the OCP spec). An infinity (no NaN) -> NaN scale under `"ocp"`
(floor(log2 inf) exceeds the E8M0 range), and every element NaN; code 254 under
`"round_up"`, the infinity saturating to $\pm$max and the finite elements flushing towards
zero. TE's kernel multiplies by 1 instead of $2^{127}$ when the code is 0 (a special case of
its reciprocal helper); here $V / X$ is always exact, which only matters for amax below
about 1e-36.

MXINT8 (`elem_format="int8"`, OCP MX v1.0 sec. 5.4.1): the element is an 8-bit integer
k with an implicit scale $2^{-6}$, so $P_i = k / 64$ with $|k| \le 127$, i.e. the
fixed-point grid 0, 1/64, ..., 127/64 and its negatives. It is held as the Format
[MXINT8][normlab.precision.MXINT8] (E1M6, bias 1, no NaN: subnormals k/64 for k < 64, the
one normal binade 1 + j/64), so $e_{max,elem} = 0$ and the element rounding is
[quantize][normlab.precision.quantize]'s (nearest, ties to even, saturating to
$\pm 127/64$). The code -128 (-2.0) is never produced, as in microxcaling's MX reference
(symmetric clipping); `element_codes()` returns the two's-complement int8 k.

Length along the axis not divisible by block_size: ValueError, or with `pad=True` the
last block is padded with zeros (which changes no amax) and the elements are returned
unpadded.

Dimension letters: B blocks along the axis, K block_size, R all other axes flattened.
Rouhani et al., "Microscaling Data Formats for Deep Learning", 2023.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_axis, check_int
from normlab.precision.formats.codes import encode
from normlab.precision.formats.format import Format
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.namespace import NUMPY, ArrayNamespace, namespace_of
from normlab.precision.scaled.recipe_formats import MXINT8, mx_element_format, mx_scale_rule

__all__ = ["MXINT8", "MXTensor", "e8m0_scales", "mx_dequantize", "mx_quantize"]


def e8m0_scales(codes: Any) -> Any:
    """E8M0 codes -> float32 scales $2^{code - 127}$; code 255 -> NaN (arrays or tensors).

    Examples
    --------
    >>> e8m0_scales(np.array([127, 128, 255], np.uint8)).tolist()
    [1.0, 2.0, nan]
    """
    return core.e8m0_values(codes, xp=namespace_of(codes))


@dataclass(frozen=True)
class MXTensor:
    """The result of [mx_quantize][normlab.precision.mx_quantize] (NumPy arrays) and of
    its torch twin (tensors on the input's device).

    Attributes
    ----------
    elements : numpy.ndarray or torch.Tensor
        float32, x's shape, values of `elem_format` (NaN in NaN blocks).
    scale_codes : numpy.ndarray or torch.Tensor
        uint8 E8M0 codes, x's shape with the axis length replaced by B.
    elem_format : Format
        The element format.
    block_size : int
        Elements per scale.
    axis : int
        The blocked axis (non-negative).
    """

    elements: Any
    scale_codes: Any
    elem_format: Format
    block_size: int
    axis: int

    @property
    def scales(self) -> Any:
        """The shared scales $2^{code - 127}$ as float32 (NaN for code 255)."""
        return e8m0_scales(self.scale_codes)

    def dequantize(self) -> Any:
        r"""$X \cdot P_i$ in float32 (see [mx_dequantize][normlab.precision.mx_dequantize])."""
        return mx_dequantize(self)

    def element_codes(self) -> np.ndarray:
        """The elements' bit codes in `elem_format` (unsigned ints, x's shape; NumPy only).

        Elements of a NaN block are stored as code 0: the scale code 255 already makes the
        whole block NaN, and fp6/fp4 have no NaN code.

        Raises
        ------
        TypeError
            If the elements are not a NumPy array (convert a tensor's first).
        """
        if not isinstance(self.elements, np.ndarray):
            raise TypeError("element_codes() needs NumPy elements; got "
                            f"{type(self.elements).__name__} (convert them first)")
        vals = np.where(np.isnan(self.elements), np.float32(0.0), self.elements)
        if self.elem_format == MXINT8:  # two's complement int8 k (the value is k / 64)
            return np.rint(vals * 64).astype(np.int8)
        return encode(vals.astype(np.float32), self.elem_format)


def mx_quantize(
    x: Any,
    elem_format: Format | str = "e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "ocp",
    pad: bool = False,
) -> MXTensor:
    """Quantise `x` to MX: one E8M0 scale per `block_size` elements along `axis`.

    Formula and special blocks in the module header.

    Parameters
    ----------
    x : array_like
        Float array with at least one dimension.
    elem_format : Format or str, optional
        Element format or name (`"e4m3"`, `"e5m2"`, `"fp6_e3m2"`, `"fp6_e2m3"`, `"fp4"`,
        ..., or `"int8"` for MXINT8). Default `"e4m3"`.
    block_size : int, optional
        Elements per scale, >= 1. Default 32.
    axis : int, optional
        The blocked axis. Default -1.
    scale_rule : str, optional
        `"ocp"` (alias `"floor"`) or `"round_up"` (aliases `"te"`, `"ceil"`). Default
        `"ocp"`.
    pad : bool, optional
        Allow a length that is not a multiple of `block_size` (zero-padded last block).

    Returns
    -------
    t : MXTensor
        Elements and scale codes.

    Raises
    ------
    TypeError
        Non-float `x`, a non-int `block_size` or `axis`.
    ValueError
        A bad `block_size`, `axis` or rule, or an indivisible length without `pad`.

    Examples
    --------
    >>> t = mx_quantize(np.array([1.0, 3.0, 0.3, -6.5]), "fp4", block_size=4)
    >>> t.scale_codes.tolist(), t.elements.tolist()   # amax 6.5: e = 2 - 2 = 0
    ([127], [1.0, 3.0, 0.5, -6.0])
    >>> t = mx_quantize(np.array([3.0, -0.1, 1.5, 0.02]), "int8", block_size=4)
    >>> t.scale_codes.tolist(), t.element_codes().tolist()   # X = 2^1; k = round(64 V / 2)
    ([128], [96, -3, 48, 1])
    """
    arr = as_float_array(x, "x", min_ndim=1)
    return mx_tensor(arr, mx_element_format(elem_format), block_size, axis, scale_rule, pad,
                     xp=NUMPY)


def mx_tensor(x: Any, fmt: Format, block_size: Any, axis: Any, scale_rule: Any, pad: Any, *,
              xp: ArrayNamespace) -> MXTensor:
    """[mx_quantize][normlab.precision.mx_quantize] of an array of `xp` (a NumPy array or a
    tensor) whose type the caller checked: the remaining checks, then the shared steps."""
    k = check_int(block_size, "block_size", minimum=1)
    ax = check_axis(axis, len(x.shape))
    rule = mx_scale_rule(scale_rule)
    n = x.shape[ax]
    if n % k and not pad:
        raise ValueError(f"x.shape[{ax}] = {n} is not a multiple of block_size = {k}; "
                         "pass pad=True to zero-pad the last block")
    elems, codes = core.mx_quantize_parts(x, fmt, block_size=k, axis=ax, rule=rule, xp=xp)
    return MXTensor(elements=elems, scale_codes=xp.astype(codes, "uint8"), elem_format=fmt,
                    block_size=k, axis=ax)


def mx_dequantize(t: MXTensor) -> Any:
    r"""$X \cdot P_i$ in float32: each scale repeated over its block (NaN scale -> NaN block).

    Products beyond float32's range become inf (only possible for scales near $2^{127}$).

    Parameters
    ----------
    t : MXTensor
        The quantised array.

    Returns
    -------
    out : numpy.ndarray or torch.Tensor
        float32, the elements' shape.

    Raises
    ------
    TypeError
        If `t` is not an MXTensor.
    """
    if not isinstance(t, MXTensor):
        raise TypeError(f"t must be an MXTensor; got {type(t).__name__}")
    return core.mx_dequantize_values(t.elements, t.scale_codes, block_size=t.block_size,
                                     axis=t.axis, xp=namespace_of(t.elements))
