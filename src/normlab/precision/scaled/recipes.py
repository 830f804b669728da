r"""Every scaled-precision recipe as frozen settings: one place, no framework.

A recipe is a frozen dataclass (hashable, comparable) that holds settings only; the state
a recipe needs (delayed scaling's amax history and scale) lives in the object that uses it
([Fp8Meta][normlab.precision.Fp8Meta], its torch twin, or the training layer
`normlab.torch.QuantLinear`). The arithmetic each recipe names is written once, in
[normlab.precision.scaled.scales][], [normlab.precision.scaled.block_scales][] and
[normlab.precision.scaled.arithmetic][]. `normlab.torch` and `normlab.torch.recipes` re-export
the training recipes under their old names.

A linear layer runs three GEMMs; a training recipe quantises each GEMM's two operands with
blocks along *that* GEMM's contraction dimension (the layout tensor cores read):

```text
forward   y  = x W^T    x (M,K) blocked along K,  W (N,K) blocked along K
dgrad     dx = dy W     dy (M,N) blocked along N, W (N,K) blocked along N
wgrad     dW = dy^T x   dy (M,N) blocked along M, x (M,K) blocked along M
```

Per-tensor recipes give the same values whatever the axis. A `"forward"` operand is x or
W, a `"backward"` one is dy. Each recipe names the quantizer of every (operand, axis) in
its `make_quantizer`, the one place that decides it ([normlab.precision.scaled.recipe][],
`normlab.precision.scaled.quantizers`); the FP8 recipes live in
[normlab.precision.scaled.fp8_recipes][].

Sources: Micikevicius et al., "FP8 Formats for Deep Learning", 2022 (E4M3 forward, E5M2
gradients, per-tensor scaling; Transformer Engine's `DelayedScaling` and
`Float8CurrentScaling`); Rouhani et al., "Microscaling Data Formats for Deep Learning",
2023 (MX); NVIDIA, "Pretraining Large Language Models with NVFP4", 2025; DeepSeek-AI,
"DeepSeek-V3 Technical Report", 2024 (blockwise FP8); torchao's row-wise FP8 recipes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from normlab._validate import check_int
from normlab.precision.formats.format import FLOAT4_E2M1FN, Format, get_format
from normlab.precision.scaled.fp8_recipes import (
    ROWWISE_EPSILON,
    BlockwiseFp8Recipe,
    DelayedScaling,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
)
from normlab.precision.scaled.quantizers import (
    MXQuantizer,
    NVFP4Quantizer,
    Quantizer,
    RoundQuantizer,
)
from normlab.precision.scaled.recipe import (
    OPERANDS,
    Recipe,
    check_bool,
    grad_role,
)
from normlab.precision.scaled.recipe_formats import (
    FP8_FORMATS,
    MXINT8,
    ROLES,
    fp8_format_for,
    mx_element_format,
    mx_scale_rule,
)

__all__ = [
    "FP8_FORMATS",
    "MXINT8",
    "OPERANDS",
    "RECIPES",
    "ROLES",
    "ROWWISE_EPSILON",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "DelayedScaling",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "Fp8RowwiseRecipe",
    "MXRecipe",
    "NVFP4Recipe",
    "Recipe",
    "check_recipe",
    "fp8_format_for",
    "mx_element_format",
    "mx_scale_rule",
]


@dataclass(frozen=True)
class Bf16Recipe(Recipe):
    r"""The 16-bit baseline: every operand rounded to nearest, float32 accumulation.

    $q(t) = \mathrm{round}_{fmt}(t)$, no scale.

    Attributes
    ----------
    fmt : str
        The operand format. Default `"bf16"` (`"fp16"` or any normlab format works).
    """

    fmt: str = "bf16"

    scaled: ClassVar[bool] = False
    """The operands carry scales (a low-precision recipe)."""

    def __post_init__(self) -> None:
        get_format(self.fmt)  # raises ValueError naming the format

    def format_for(self, role: str) -> Format:
        """The operand format (the same for every role)."""
        return get_format(self.fmt)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """Elementwise rounding of every operand."""
        return RoundQuantizer(self.format_for(grad_role(role)))


@dataclass(frozen=True)
class MXRecipe(Recipe):
    r"""OCP Microscaling: one E8M0 (power-of-two) scale per `block_size` elements.

    A block's scale is $2^e$ with $e = \lfloor \log_2 \mathrm{amax} \rfloor - e_{max,elem}$
    (`"ocp"`) or TE's round-up rule (`"round_up"`), see
    [mx_scale_codes][normlab.precision.scaled.block_scales.mx_scale_codes]; elements are
    $\mathrm{sat\_round}(v / 2^e)$ to nearest even, a block holding a NaN or (OCP) an
    infinity is NaN.

    Attributes
    ----------
    elem : str
        Element format of x and W (`"e4m3"`, `"e5m2"`, `"fp6_e3m2"`, `"fp6_e2m3"`,
        `"fp4"`, `"int8"` for MXINT8, ...). Default `"e4m3"`.
    grad_elem : str or None
        Element format of dy; None means `elem`.
    block_size : int
        Elements per scale. Default 32.
    scale_rule : {"ocp", "round_up"}
        Default `"ocp"` (aliases as
        [mx_scale_rule][normlab.precision.scaled.recipes.mx_scale_rule]).
    """

    elem: str = "e4m3"
    grad_elem: str | None = None
    block_size: int = 32
    scale_rule: str = "ocp"

    def __post_init__(self) -> None:
        mx_element_format(self.elem)
        if self.grad_elem is not None:
            mx_element_format(self.grad_elem)
        check_int(self.block_size, "block_size", minimum=1)
        object.__setattr__(self, "scale_rule", mx_scale_rule(self.scale_rule))

    def format_for(self, role: str) -> Format:
        """The element format of a `"forward"` or `"backward"` operand."""
        if role == "backward" and self.grad_elem is not None:
            return mx_element_format(self.grad_elem)
        return mx_element_format(self.elem)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """E8M0-scaled blocks of `block_size` along the GEMM's contraction axis."""
        return MXQuantizer(self.format_for(grad_role(role)), axis, self.block_size,
                           self.scale_rule)


@dataclass(frozen=True)
class NVFP4Recipe(Recipe):
    r"""NVFP4 training: E2M1 elements, an E4M3 scale per 16 elements, an FP32 tensor scale.

    $S_{enc} = 6 \cdot 448 / \mathrm{amax}(t)$, block scale
    $s_b = \mathrm{e4m3}(\mathrm{amax}_b / 6 \cdot S_{enc})$, elements
    $\mathrm{e2m1}(x \cdot S_{enc} / s_b)$, value $\mathrm{e2m1}(\dots) \cdot s_b / S_{enc}$
    ([nvfp4_scales][normlab.precision.scaled.block_scales.nvfp4_scales] has the float32 order).

    Attributes
    ----------
    two_d_weights : bool
        16 x 16 weight blocks, so W and W^T quantise identically in forward and dgrad
        (else 1 x 16 along each GEMM's contraction). Default True.
    stochastic_gradients : bool
        dy rounded stochastically in both backward GEMMs. Default True.
    hadamard : bool
        A 16-point random Hadamard transform (normlab's
        [random_hadamard_transform][normlab.precision.random_hadamard_transform], seeded
        with `seed`) of both wgrad inputs along M; it cancels in $dy^T x$ and spreads
        outliers before rounding. Default True.
    seed : int
        Fixes the Hadamard signs and the stochastic-rounding streams. Default 0.
    """

    two_d_weights: bool = True
    stochastic_gradients: bool = True
    hadamard: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("two_d_weights", "stochastic_gradients", "hadamard"):
            check_bool(getattr(self, name), name)
        check_int(self.seed, "seed")

    def format_for(self, role: str) -> Format:
        """E2M1 for every operand."""
        return FLOAT4_E2M1FN

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """1 x 16 blocks along the contraction axis; 16 x 16 weight tiles with
        `two_d_weights`."""
        return NVFP4Quantizer(FLOAT4_E2M1FN, axis, tile=role == "w" and self.two_d_weights)

    @property
    def hadamard_seed(self) -> int | None:
        """`seed` when the wgrad inputs go through the random Hadamard transform."""
        return self.seed if self.hadamard else None


RECIPES: tuple[type, ...] = (Bf16Recipe, Fp8DelayedRecipe, Fp8CurrentRecipe, Fp8RowwiseRecipe,
                             MXRecipe, NVFP4Recipe, BlockwiseFp8Recipe)
"""The training recipes, in the order the documentation lists them."""


def check_recipe(recipe: object) -> Recipe:
    """`recipe` if it is a training recipe (a [Recipe][normlab.precision.scaled.recipes.Recipe]).

    Raises
    ------
    TypeError
        Otherwise (the message lists the recipes).
    """
    if not isinstance(recipe, Recipe):
        names = ", ".join(r.__name__ for r in RECIPES)
        raise TypeError(f"recipe must be one of {names}; got {recipe!r}")
    return recipe
