r"""A training GEMM's operand under its quantizer: fake-quantised, or encoded as codes plus scales.

Dimension letters: R, C the operand's rows and columns.

A linear layer's three GEMMs each multiply two quantised operands
([normlab.precision.scaled.recipes][] has the table); the recipe names each operand's quantizer
(`normlab.precision.scaled.quantizers`), whose family arithmetic these functions run.
[fake_operand][normlab.precision.operands.operand.fake_operand] gives the float32 values such a
GEMM multiplies (`dequantize(quantize(x))`);
[encode_operand][normlab.precision.operands.operand.encode_operand] keeps the same operand as a
low-precision GEMM would store it: integer element codes of the recipe's format (two E2M1
codes per byte for NVFP4) plus the scales (E8M0 codes for MX, E4M3 codes and the float32
tensor scale for NVFP4, float32 inverse scales for FP8), and
[decode_operand][normlab.precision.operands.operand.decode_operand] turns it back into exactly the
values `fake_operand` gives. Training layers save the encoded wgrad operand for backward
(Transformer Engine's quantised tensors with columnwise usage) instead of a float32 copy.

Each function is written once against the array namespace `xp`
([normlab.precision.scaled.namespace][]); the operand enters as its float32 value (16-bit
inputs widen exactly), as the layer's float32 GEMMs take it. On NumPy arrays each runs
the numba kernel of its name (`normlab.kernels.operand`) where one serves the call: the
same values in one pass over the operand, reading float32 or bfloat16 in place.

Codes are [normlab.precision.operands.codes][] (a NaN outside a NaN-scaled block takes the
format's NaN code). `order` fixes the results' layout: `"C"` rows contiguous, `"F"`
columns contiguous (the layout of each recipe's torch path); codes are stored with that
layout's contiguous axis last, NVFP4's paired along it.
"""

from __future__ import annotations

import warnings
from typing import Any

from normlab.precision.operands.codes import (
    Encoded,
    element_codes,
    element_values,
    pack_pairs,
    unpack_pairs,
)
from normlab.precision.scaled.namespace import ArrayNamespace, namespace_of
from normlab.precision.scaled.quantizers import Quantizer

__all__ = [
    "decode_operand",
    "encode_operand",
    "fake_operand",
    "operand_spec",
]


def operand_spec(recipe: Any, role: str, axis: int) -> Quantizer:
    """Deprecated: `recipe.quantizer(role, axis)`, the quantizer of operand `role` (`"x"`,
    `"w"` or `"dy"`) blocked along `axis`.

    Raises
    ------
    TypeError
        If `recipe` is not a training recipe.
    """
    warnings.warn("operand_spec(recipe, role, axis) is deprecated; use "
                  "recipe.quantizer(role, axis)", DeprecationWarning, stacklevel=2)
    from normlab.precision.scaled.recipes import check_recipe

    return check_recipe(recipe).quantizer(role, axis)


def __getattr__(name: str) -> Any:
    if name == "OperandSpec":  # the kind-string spec before the quantizer classes
        warnings.warn("normlab.precision.operands.OperandSpec is deprecated; operands are "
                      "described by normlab.precision.scaled.Quantizer subclasses",
                      DeprecationWarning, stacklevel=2)
        return Quantizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _layout(x: Any, order: str, xp: ArrayNamespace) -> Any:
    """Logical 2-D `x` as stored: `x` (order "C") or its transpose (order "F"), rows last."""
    return xp.ordered(x if order == "C" else xp.moveaxis(x, 0, 1), "C")


def _from_layout(stored: Any, order: str, xp: ArrayNamespace) -> Any:
    return stored if order == "C" else xp.moveaxis(stored, 0, 1)


def _check(q: Any) -> Quantizer:
    if not isinstance(q, Quantizer):
        raise TypeError("quantizer must be a normlab.precision.scaled.Quantizer; "
                        f"got {q!r}")
    return q


def _fake_reference(x: Any, q: Quantizer, scale: Any, seed: int | None, order: str) -> Any:
    xp = namespace_of(x)
    with xp.quiet():
        w = xp.astype(x, "float32")  # R,C
        return xp.ordered(q.values(w, scale, seed if q.stochastic else None, xp), order)


def fake_operand(x: Any, quantizer: Quantizer, *, scale: Any = None,
                 seed: int | None = None, order: str = "C",
                 xp: ArrayNamespace | None = None) -> Any:
    """`dequantize(quantize(x))` of operand `x` under `quantizer`: the values its GEMM
    multiplies.

    Parameters
    ----------
    x : array, shape (R, C)
        float32, float64 or a 16-bit float (taken as its float32 value).
    quantizer : Quantizer
        The recipe's quantizer of the operand (its role and axis).
    scale : array, optional
        The float32 scale (0-d) of the per-tensor kind.
    seed : int, optional
        NVFP4: round the elements stochastically with this stream (element i of x's
        flattened C order takes the word of `seed + i`).
    order : {"C", "F"}, optional
        The result's layout. Default "C".
    xp : ArrayNamespace, optional
        The namespace of `x` (default: inferred).

    Returns
    -------
    out : array of float32, shape (R, C)
        Bit for bit the recipe's public function dequantised.

    Examples
    --------
    >>> from normlab.precision.scaled.recipes import MXRecipe
    >>> q = MXRecipe("fp4").quantizer("x", 1)
    >>> fake_operand(np.float32([[0.3, 1.0, 5.0, 7.0]]), q).tolist()
    [[0.0, 1.0, 4.0, 8.0]]
    """
    xp = namespace_of(x) if xp is None else xp
    return xp.dispatch("fake_operand", _fake_reference, x, _check(quantizer), scale, seed,
                       order)


def _encode_reference(x: Any, q: Quantizer, scale: Any, order: str) -> Encoded:
    xp = namespace_of(x)
    with xp.quiet():
        w = xp.astype(x, "float32")  # R,C
        elems, scales, tensor_scale = q.quantized(w, scale, xp)
        codes = _layout(element_codes(elems, q.fmt, xp), order, xp)
        return q.encoded(pack_pairs(codes, xp) if q.packed else codes, scales, tensor_scale)


def encode_operand(x: Any, quantizer: Quantizer, *, scale: Any = None, order: str = "C",
                   xp: ArrayNamespace | None = None) -> Encoded:
    """Operand `x` as codes plus scales (round to nearest); decodes to `fake_operand(x, ...)`.

    Parameters
    ----------
    x, quantizer, scale, xp
        As [fake_operand][normlab.precision.operands.operand.fake_operand] takes them.
    order : {"C", "F"}, optional
        The stored layout of the codes (see the module header). Default "C".

    Returns
    -------
    encoded : Encoded
        The element codes, the per-block scales (codes or float32, by recipe) and NVFP4's
        tensor scale, which decode to the operand exactly.

    Examples
    --------
    >>> from normlab.precision.scaled.recipes import Fp8CurrentRecipe
    >>> q = Fp8CurrentRecipe().quantizer("x", 1)
    >>> enc = encode_operand(np.float32([[1.0, -2.0]]), q, scale=np.float32(1.0))
    >>> enc.codes.tolist(), float(enc.scales)
    ([[56, 192]], 1.0)
    """
    xp = namespace_of(x) if xp is None else xp
    out: Encoded = xp.dispatch("encode_operand", _encode_reference, x, _check(quantizer),
                               scale, order)
    return out


def _decode_reference(enc: Encoded, q: Quantizer, shape: tuple[int, int],
                      order: str) -> Any:
    xp = namespace_of(enc.codes)
    with xp.quiet():
        stored = enc.codes
        if q.packed:
            stored = unpack_pairs(stored, shape[0] if order == "F" else shape[1], xp)
        elems = element_values(_from_layout(stored, order, xp), q.fmt, xp)  # R,C
        return xp.ordered(q.dequantized(elems, enc, xp), order)


def decode_operand(enc: Encoded, quantizer: Quantizer, shape: tuple[int, int], *,
                   order: str = "C", xp: ArrayNamespace | None = None) -> Any:
    """The float32 operand that `enc` holds: `fake_operand` of the encoded input, bit for bit.

    Parameters
    ----------
    enc : Encoded
        What [encode_operand][normlab.precision.operands.operand.encode_operand] returned.
    quantizer : Quantizer
        The quantizer it was encoded with.
    shape : tuple of int
        The operand's (R, C).
    order : {"C", "F"}, optional
        The layout it was encoded with, and the result's. Default "C".
    xp : ArrayNamespace, optional
        The namespace of the codes (default: inferred).

    Returns
    -------
    out : array of float32, shape (R, C)
        The dequantised operand, in the layout `order`.

    Examples
    --------
    >>> from normlab.precision.scaled.recipes import NVFP4Recipe
    >>> q = NVFP4Recipe().quantizer("x", 1)
    >>> x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    >>> enc = encode_operand(x, q)
    >>> enc.codes.shape, bool((decode_operand(enc, q, x.shape) == fake_operand(x, q)).all())
    ((2, 8), True)
    """
    xp = namespace_of(enc.codes) if xp is None else xp
    return xp.dispatch("decode_operand", _decode_reference, enc, _check(quantizer),
                       tuple(shape), order)
