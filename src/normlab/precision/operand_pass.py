"""One operand's values and its codes from one pass: the forward GEMM's input and its saved
wgrad copy.

Dimension letters: R, C the operand's rows and columns.

A training layer's forward multiplies `fake_operand(x)` and keeps `encode_operand(x)` for
the wgrad GEMM ([normlab.precision.operands][]). Where the two are the same quantisation
(elementwise rounding, one per-tensor scale: the Bf16 and FP8 recipes, whose values do not
depend on the blocking axis), one pass over `x` can write both: each element is scaled and
rounded once, then stored as a value and as a code.
[fake_encode_operand][normlab.precision.operand_pass.fake_encode_operand] is that pass; its
reference is the two functions one after the other, and on NumPy arrays the numba kernel
of its name serves it for those kinds (the other kinds run the reference: their two
blockings differ).
"""

from __future__ import annotations

from typing import Any

from normlab.precision.namespace import ArrayNamespace, namespace_of
from normlab.precision.operand_codes import Encoded
from normlab.precision.operands import OperandSpec, encode_operand, fake_operand

__all__ = ["fake_encode_operand"]


def _reference(x: Any, spec: OperandSpec, scale: Any, order: str) -> tuple[Any, Encoded]:
    return (fake_operand(x, spec, scale=scale, order=order),
            encode_operand(x, spec, scale=scale, order=order))


def fake_encode_operand(x: Any, spec: OperandSpec, *, scale: Any = None, order: str = "C",
                        xp: ArrayNamespace | None = None) -> tuple[Any, Encoded]:
    """`(fake_operand(x, spec), encode_operand(x, spec))`, computed together.

    Parameters
    ----------
    x : array, shape (R, C)
        float32, float64 or a 16-bit float (taken as its float32 value).
    spec : OperandSpec
        The recipe, role and axis.
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
    >>> from normlab.precision.operands import operand_spec
    >>> from normlab.precision.recipes import Fp8CurrentRecipe
    >>> spec = operand_spec(Fp8CurrentRecipe(), "x", 0)
    >>> v, enc = fake_encode_operand(np.float32([[1.0, -2.1]]), spec, scale=np.float32(1.0))
    >>> v.tolist(), enc.codes.tolist()
    ([[1.0, -2.0]], [[56, 192]])
    """
    xp = namespace_of(x) if xp is None else xp
    out: tuple[Any, Encoded] = xp.dispatch("fake_encode_operand", _reference, x, spec, scale,
                                           order)
    return out
