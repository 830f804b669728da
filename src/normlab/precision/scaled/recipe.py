"""The base of the training recipes: each recipe names its operands' quantizers, once.

A training recipe ([normlab.precision.scaled.recipes][]) is frozen settings. Its
`make_quantizer(role, axis)` is the one place that decides which
[Quantizer][normlab.precision.scaled.quantizer.Quantizer] a GEMM operand gets (x, W or dy,
blocked along the GEMM's contraction axis); `Recipe.quantizer` checks its arguments and returns it.
The class attributes say what else a training layer keeps for the recipe (delayed-scaling
state, stochastic gradients, amax reduction, a Hadamard transform); the layer reads them
and never tests a recipe's class. The validation shared by the recipes' settings lives
here too, written once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from normlab._validate import check_amax_epsilon
from normlab.precision.formats.format import Format
from normlab.precision.scaled.quantizers import Quantizer
from normlab.precision.scaled.recipe_formats import FP8_FORMATS

__all__ = ["OPERANDS", "Recipe", "check_bool", "check_epsilon", "grad_role",
           "upper_fp8_format"]

OPERANDS = ("x", "w", "dy")
"""A linear layer's GEMM operands: input, weight, output gradient."""


def check_bool(value: object, name: str) -> None:
    """Raise TypeError unless the field `name` holds a Python bool (a recipe is hashed and
    compared; a NumPy bool would compare equal but not keep its type)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False); got {value!r}")


def upper_fp8_format(recipe: object) -> None:
    """Check a recipe's `fp8_format` and store it upper case (`"hybrid"`, `"e4m3"` accepted)."""
    value = getattr(recipe, "fp8_format")  # noqa: B009  (a field of each caller)
    if not isinstance(value, str) or value.upper() not in FP8_FORMATS:
        raise ValueError(f"fp8_format must be one of {FP8_FORMATS}; got {value!r}")
    object.__setattr__(recipe, "fp8_format", value.upper())


def check_epsilon(value: Any) -> None:
    """Raise unless `amax_epsilon` is a finite real >= 0."""
    check_amax_epsilon(value)


def grad_role(role: str) -> str:
    """`"backward"` for dy, `"forward"` for x and W (the role `format_for` takes)."""
    return "backward" if role == "dy" else "forward"


class Recipe:
    """The base of the training recipes: frozen settings that name each operand's quantizer.

    A subclass decides, in `make_quantizer` and nowhere else, which quantizer each GEMM
    operand gets; the class attributes below say what else a training layer keeps for it.
    """

    scaled: ClassVar[bool] = True
    """The operands carry scales (a low-precision recipe); False for the 16-bit baseline,
    which `normlab.torch.training.convert` may apply to the LM head too."""
    delayed: ClassVar[bool] = False
    """Per-tensor scales come from an amax history updated once per step (the layer keeps
    the history and the scales)."""
    amax_history_len: int = 0
    """Length of each operand's amax history (delayed scaling), 0 for none."""
    stochastic_gradients: bool = False
    """dy is rounded stochastically in both backward GEMMs."""
    reduce_amax: bool = False
    """Per-tensor amaxes are all-reduced with MAX over the process group."""

    def format_for(self, role: str) -> Format:
        """The element format of a `"forward"` operand (x, W) or a `"backward"` one (dy)."""
        raise NotImplementedError

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """The quantizer of operand `role` blocked along `axis` (built, not cached)."""
        raise TypeError(f"{type(self).__name__} names no quantizers")

    def quantizer(self, role: str, axis: int) -> Quantizer:
        """The quantizer of operand `role` (`"x"`, `"w"` or `"dy"`) for a GEMM contracting
        its `axis` (0 or 1), checked (a training layer keeps its six).

        Raises
        ------
        ValueError
            If `role` or `axis` is not one of those.

        Examples
        --------
        >>> from normlab.precision import MXRecipe
        >>> MXRecipe().quantizer("dy", 0).block
        (32, 1)
        """
        if role not in OPERANDS:
            raise ValueError(f"role must be one of {OPERANDS}; got {role!r}")
        if axis not in (0, 1):
            raise ValueError(f"axis must be 0 or 1; got {axis!r}")
        return self.make_quantizer(role, axis)

    @property
    def hadamard_seed(self) -> int | None:
        """The seed of the random Hadamard transform of the wgrad inputs, None for none."""
        return None

    def scale_from_amax(self, amax: Any, fmt: Format, *, xp: Any) -> Any:
        """Current scaling's float32 scale of an operand whose amax is `amax`."""
        raise TypeError(f"{type(self).__name__} has no current per-tensor scaling")

    def delayed_update(self, history: Any, scale: Any, fmt: Format, *,
                       xp: Any) -> tuple[Any, Any]:
        """Delayed scaling's end of step: `(rolled history, new scale)` of operands in
        `fmt` (rows of `history` and `scale`)."""
        raise TypeError(f"{type(self).__name__} has no delayed scaling")
