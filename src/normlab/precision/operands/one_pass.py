"""One operand's values and its codes from one pass: the forward GEMM's input and its saved
wgrad copy.

Dimension letters: R, C the operand's rows and columns.

A training layer's forward multiplies `fake_operand(x)` and keeps `encode_operand(x)` for
the wgrad GEMM ([normlab.precision.operands.operand][]). Where the two are the same quantisation
(a quantizer whose values do not depend on the blocking axis, `Quantizer.axis_free`:
elementwise rounding, one per-tensor scale), one pass over `x` can write both: each
element is scaled and rounded once, then stored as a value and as a code.
[fake_encode_operand][normlab.precision.operands.one_pass.fake_encode_operand] is that pass; its
reference is the two functions one after the other, and on NumPy arrays the numba kernel
of its name serves it for those quantizers (the others run the reference: their two
blockings differ).
"""

from __future__ import annotations

from typing import Any

from normlab.precision.operands.codes import Encoded
from normlab.precision.operands.operand import encode_operand, fake_operand
from normlab.precision.scaled.namespace import ArrayNamespace, namespace_of
from normlab.precision.scaled.quantizers import Quantizer

__all__ = ["fake_encode_operand"]


def _reference(x: Any, q: Quantizer, scale: Any, order: str) -> tuple[Any, Encoded]:
    return (fake_operand(x, q, scale=scale, order=order),
            encode_operand(x, q, scale=scale, order=order))


def fake_encode_operand(x: Any, quantizer: Quantizer, *, scale: Any = None, order: str = "C",
                        xp: ArrayNamespace | None = None) -> tuple[Any, Encoded]:
    """`(fake_operand(x, quantizer), encode_operand(x, quantizer))`, computed together.

    Parameters
    ----------
    x : array, shape (R, C)
        float32, float64 or a 16-bit float (taken as its float32 value).
    quantizer : Quantizer
        The recipe's quantizer of the operand.
    scale : array, optional
        The float32 scale (0-d) of the per-tensor kind.
    order : {"C", "F"}, optional
        The layout of both results. Default "C".
    xp : ArrayNamespace, optional
        The namespace of `x` (default: inferred).

    Returns
    -------
    values : array of float32, shape (R, C)
        What `fake_operand` returns.
    encoded : Encoded
        What `encode_operand` returns.

    Examples
    --------
    >>> from normlab.precision.scaled.recipes import Fp8CurrentRecipe
    >>> q = Fp8CurrentRecipe().quantizer("x", 0)
    >>> v, enc = fake_encode_operand(np.float32([[1.0, -2.1]]), q, scale=np.float32(1.0))
    >>> v.tolist(), enc.codes.tolist()
    ([[1.0, -2.0]], [[56, 192]])
    """
    xp = namespace_of(x) if xp is None else xp
    out: tuple[Any, Encoded] = xp.dispatch("fake_encode_operand", _reference, x, quantizer,
                                           scale, order)
    return out
