"""The base of the quantizers: the contract every scaling family implements, and its key.

`normlab.precision.scaled.quantizers` has the families and the table of which recipe uses which.
A subclass with a `family` name registers itself, so that
[Quantizer.from_key][normlab.precision.scaled.quantizer.Quantizer.from_key] can rebuild any
quantizer from the key a compiled graph holds; an unknown family is a TypeError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from normlab.precision.formats.format import Format
from normlab.precision.operands.codes import Encoded
from normlab.precision.scaled.namespace import ArrayNamespace
from normlab.precision.scaled.recipe_formats import mx_element_format

__all__ = ["Quantizer", "cdiv"]

_FAMILIES: dict[str, type[Quantizer]] = {}


def _field_text(value: Any) -> str:
    if isinstance(value, Format):
        return value.name
    if isinstance(value, bool):
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


_PARSE: dict[str, Callable[[str], Any]] = {
    "Format": mx_element_format, "int": int, "bool": lambda s: s == "1", "str": str,
    "float": float}


@dataclass(frozen=True)
class Quantizer:
    """How one 2-D GEMM operand is quantised: the base of the scaling families.

    Attributes
    ----------
    fmt : Format
        The element format.
    axis : int
        The GEMM's contraction axis of the operand (0 or 1): 1-D blocks run along it.
    """

    fmt: Format
    axis: int = 1

    family: ClassVar[str] = ""
    """The family's name, the first field of the key."""
    takes_scale: ClassVar[bool] = False
    """A per-tensor float32 scale is passed in (FP8 delayed and current scaling)."""
    stochastic: ClassVar[bool] = False
    """Elements may be rounded stochastically (`seed=`)."""
    packed: ClassVar[bool] = False
    """Two element codes share a byte (E2M1)."""
    saturates: ClassVar[bool] = True
    """Scaled elements saturate at the format's max (elementwise rounding does not)."""
    has_scales: ClassVar[bool] = True
    """The operand carries scales (not so elementwise rounding and the identity)."""
    columns_first_off_cpu: ClassVar[bool] = False
    """Off the CPU, 1-D blocks along axis 0 are computed (and stored) columns first."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.family:
            _FAMILIES[cls.family] = cls

    @property
    def block(self) -> tuple[int, int]:
        """One block's (rows, columns) in the operand; (0, 0) for per-tensor and elementwise."""
        return (0, 0)

    @property
    def axis_free(self) -> bool:
        """The values do not depend on the blocking axis (no blocks): one quantisation
        serves every GEMM of the operand."""
        return self.block == (0, 0)

    @property
    def scales_transposed(self) -> bool:
        """The scale grid is that of the transposed operand (1-D FP8 blocks along axis 0)."""
        return False

    def key(self) -> str:
        """A string that [from_key][normlab.precision.scaled.quantizer.Quantizer.from_key] reads
        back (the form a compiled graph holds): the family, then every field."""
        return ":".join([self.family, *(_field_text(getattr(self, f.name))
                                        for f in fields(self))])

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def from_key(key: str) -> Quantizer:
        """The quantizer that `key()` wrote.

        Raises
        ------
        TypeError
            If the key names no known family.
        """
        family, *values = key.split(":")
        cls = _FAMILIES.get(family)
        if cls is None:
            raise TypeError(f"unknown quantizer family {family!r} in key {key!r}; known: "
                            f"{sorted(_FAMILIES)}")
        kinds = [str(f.type) for f in fields(cls)]
        return cls(*(_PARSE[k](v) for k, v in zip(kinds, values, strict=True)))

    # --- the family's reference arithmetic (float32 operand `w`, logical layout) ----------
    def values(self, w: Any, scale: Any, seed: int | None, xp: ArrayNamespace) -> Any:
        """`dequantize(quantize(w))`, float32, w's shape."""
        raise NotImplementedError

    def quantized(self, w: Any, scale: Any, xp: ArrayNamespace) -> tuple[Any, Any, Any]:
        """(elements as float32 values in w's layout, scales as stored, tensor scale)."""
        raise NotImplementedError

    def dequantized(self, elems: Any, enc: Encoded, xp: ArrayNamespace) -> Any:
        """The float32 operand from its element values (w's layout) and stored scales."""
        raise NotImplementedError

    def scale_grid(self, shape: tuple[Any, Any]) -> tuple[tuple[Any, ...], str]:
        """The stored scales' shape and dtype name for an operand of `shape`; `(0,)` for
        none, `()` for one."""
        return (0,), "float32"

    def tensor_scale_shape(self) -> tuple[int, ...]:
        """The stored tensor scale's shape: `(0,)` for none."""
        return (0,)

    def encoded(self, elems: Any, scales: Any, tensor_scale: Any) -> Encoded:
        """The `Encoded` parts of an operand (None where the family stores none)."""
        return Encoded(elems, scales, tensor_scale)

    def identity_on(self, fmt: Format | None) -> bool:
        """Whether quantising an operand held in `fmt` keeps every value (rounding to its
        own format, no scale): the operand may then stand for its quantisation, up to NaN
        payloads, which quantisation makes the canonical quiet NaN."""
        return False

    def for_input(self, fmt: Format | None) -> Quantizer:
        """The quantizer to run on an operand held in `fmt` (None: another dtype, such as
        float64): itself, but for a family that depends on its input's format."""
        return self

    def multipliers(self, enc: Encoded, xp: ArrayNamespace) -> Any:
        """The float32 dequantisation multiplier of each block of an encoded operand, on
        the logical block grid (one value for a per-tensor scale; None without scales)."""
        return None


def cdiv(a: Any, b: int) -> Any:
    """ceil(a / b) for non-negative a (ints or symbolic sizes)."""
    return (a + b - 1) // b


