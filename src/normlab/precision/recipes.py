r"""Every scaled-precision recipe as frozen settings: one place, no framework.

A recipe is a frozen dataclass (hashable, comparable) that holds settings only; the state
a recipe needs (delayed scaling's amax history and scale) lives in the object that uses it
([Fp8Meta][normlab.precision.Fp8Meta], its torch twin, or the training layer
`normlab.torch.QuantLinear`). The arithmetic each recipe names is written once, in
[normlab.precision.scales][], [normlab.precision.block_scales][] and
[normlab.precision.recipe_core][]. `normlab.torch` and `normlab.torch.recipes` re-export
the training recipes under their old names.

A linear layer runs three GEMMs; a training recipe quantises each GEMM's two operands with
blocks along *that* GEMM's contraction dimension (the layout tensor cores read):

```text
forward   y  = x W^T    x (M,K) blocked along K,  W (N,K) blocked along K
dgrad     dx = dy W     dy (M,N) blocked along N, W (N,K) blocked along N
wgrad     dW = dy^T x   dy (M,N) blocked along M, x (M,K) blocked along M
```

Per-tensor recipes give the same values whatever the axis. A `"forward"` operand is x or
W, a `"backward"` one is dy.

Sources: Micikevicius et al., "FP8 Formats for Deep Learning", 2022 (E4M3 forward, E5M2
gradients, per-tensor scaling; Transformer Engine's `DelayedScaling` and
`Float8CurrentScaling`); Rouhani et al., "Microscaling Data Formats for Deep Learning",
2023 (MX); NVIDIA, "Pretraining Large Language Models with NVFP4", 2025; DeepSeek-AI,
"DeepSeek-V3 Technical Report", 2024 (blockwise FP8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from normlab._validate import check_finite_real, check_int
from normlab.precision.formats import Format, get_format
from normlab.precision.recipe_formats import (
    AMAX_ALGOS,
    FP8_FORMATS,
    MXINT8,
    ROLES,
    fp8_format_for,
    mx_element_format,
    mx_scale_rule,
)
from normlab.precision.scales import UPDATES

__all__ = [
    "FP8_FORMATS",
    "MXINT8",
    "RECIPES",
    "ROLES",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "DelayedScaling",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "MXRecipe",
    "NVFP4Recipe",
    "Recipe",
    "check_recipe",
    "fp8_format_for",
    "mx_element_format",
    "mx_scale_rule",
]

def _check_bool(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {value!r}")


def _upper_fp8_format(recipe: object) -> None:
    value = getattr(recipe, "fp8_format")  # noqa: B009  (a field of each caller)
    if not isinstance(value, str) or value.upper() not in FP8_FORMATS:
        raise ValueError(f"fp8_format must be one of {FP8_FORMATS}; got {value!r}")
    object.__setattr__(recipe, "fp8_format", value.upper())  # accept "hybrid", "e4m3"


def _check_epsilon(value: Any) -> None:
    if check_finite_real(value, "amax_epsilon") < 0:
        raise ValueError(f"amax_epsilon must be >= 0; got {value!r}")


@dataclass(frozen=True)
class DelayedScaling:
    r"""Transformer Engine's delayed scaling: per-tensor scales from an amax history.

    Each tensor keeps an amax history of length $L$ (zeros at the start) and a scale (1 at
    the start). A quantisation uses the current scale and records the tensor's amax into
    history slot 0 (a running max within the step); once per step the update computes

    $$
    s = \frac{m_{fp8} \cdot 2^{-\mathrm{margin}}}{\mathrm{amax}}, \qquad
    \mathrm{amax} = \max_{i < L} h_i \ \text{("max")} \ \text{or} \ h_0 \
    \text{("most\_recent")}
    $$

    in float32 and rolls the history, by TE 2.x's fused rule (NaN amaxes skipped, a step
    with amax 0 changes nothing) or TE's unfused one (a NaN keeps the scale while it is in
    the window); [delayed_update][normlab.precision.scales.delayed_update] states both.

    Attributes
    ----------
    margin : int
        Scales are divided by $2^{\mathrm{margin}}$. Default 0.
    amax_history_len : int
        History length $L \ge 1$. Default 1024.
    amax_compute_algo : {"max", "most_recent"}
        The window's max or the last amax. Default `"max"`.
    fp8_format : {"HYBRID", "E4M3", "E5M2"}
        HYBRID: E4M3 forward, E5M2 for gradients. Default `"HYBRID"` (lower case accepted).
    update : {"fused", "unfused"}
        TE 2.x's fused update (`delayed_scaling.cu`, the default) or TE's unfused one
        (`NVTE_UNFUSED_FP8_UPDATE`).

    Examples
    --------
    >>> DelayedScaling(amax_history_len=16).format_for("backward").name
    'float8_e5m2'
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_format: str = "HYBRID"
    update: str = "fused"

    def __post_init__(self) -> None:
        check_int(self.margin, "margin")
        check_int(self.amax_history_len, "amax_history_len", minimum=1)
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_ALGOS}; "
                             f"got {self.amax_compute_algo!r}")
        _upper_fp8_format(self)
        if self.update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}; got {self.update!r}")

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a `"forward"` operand (x, W) or a `"backward"` one (dy)."""
        return fp8_format_for(self.fp8_format, role)


@dataclass(frozen=True)
class Bf16Recipe:
    r"""The 16-bit baseline: every operand rounded to nearest, float32 accumulation.

    $q(t) = \mathrm{round}_{fmt}(t)$, no scale.

    Attributes
    ----------
    fmt : str
        The operand format. Default `"bf16"` (`"fp16"` or any normlab format works).
    """

    fmt: str = "bf16"

    def __post_init__(self) -> None:
        get_format(self.fmt)  # raises ValueError naming the format

    def format_for(self, role: str) -> Format:
        """The operand format (the same for every role)."""
        return get_format(self.fmt)


@dataclass(frozen=True)
class Fp8DelayedRecipe(DelayedScaling):
    """Delayed scaling for training: [DelayedScaling][normlab.precision.recipes.DelayedScaling]
    plus the amax reduction over ranks.

    The layer keeps, per operand x, W and dy, exactly the state of an
    [Fp8Meta][normlab.precision.Fp8Meta] with these settings.

    Attributes
    ----------
    reduce_amax : bool
        All-reduce the amaxes with MAX over the process group (TE's
        `amax_reduction_group`) before a scale update, so every rank uses the same scales.
        Default True. Keyword-only.
    """

    reduce_amax: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_bool(self.reduce_amax, "reduce_amax")

    def delayed_scaling(self) -> DelayedScaling:
        """These settings as a plain [DelayedScaling][normlab.precision.recipes.DelayedScaling]."""
        return DelayedScaling(self.margin, self.amax_history_len, self.amax_compute_algo,
                              self.fp8_format, self.update)


@dataclass(frozen=True)
class Fp8CurrentRecipe:
    r"""Per-tensor current scaling: each operand's scale from its own amax.

    $a = \max(\mathrm{amax}(t), \epsilon)$ (all-reduced over ranks first when asked),
    $s = m_{fp8} \cdot 2^{-\mathrm{margin}} / a$ in float32, 1 when $a$ is 0, inf or NaN,
    rounded down to a power of two with `power_of_2_scales` (TE `Float8CurrentScaling`).

    Attributes
    ----------
    margin : int
        Scales are divided by $2^{\mathrm{margin}}$. Default 0.
    fp8_format : {"HYBRID", "E4M3", "E5M2"}
        Default `"HYBRID"`.
    reduce_amax : bool
        All-reduce each operand's amax with MAX over the process group. Default True.
    amax_epsilon : float
        Lower bound $\epsilon \ge 0$ on the amax. Default 0.
    power_of_2_scales : bool
        Round scales down to powers of two. Default False.
    """

    margin: int = 0
    fp8_format: str = "HYBRID"
    reduce_amax: bool = True
    amax_epsilon: float = 0.0
    power_of_2_scales: bool = False

    def __post_init__(self) -> None:
        _upper_fp8_format(self)
        check_int(self.margin, "margin")
        _check_bool(self.reduce_amax, "reduce_amax")
        _check_epsilon(self.amax_epsilon)
        _check_bool(self.power_of_2_scales, "power_of_2_scales")

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a `"forward"` operand (x, W) or a `"backward"` one (dy)."""
        return fp8_format_for(self.fp8_format, role)


@dataclass(frozen=True)
class MXRecipe:
    r"""OCP Microscaling: one E8M0 (power-of-two) scale per `block_size` elements.

    A block's scale is $2^e$ with $e = \lfloor \log_2 \mathrm{amax} \rfloor - e_{max,elem}$
    (`"ocp"`) or TE's round-up rule (`"round_up"`), see
    [mx_scale_codes][normlab.precision.block_scales.mx_scale_codes]; elements are
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
        Default `"ocp"` (aliases as [mx_scale_rule][normlab.precision.recipes.mx_scale_rule]).
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


@dataclass(frozen=True)
class NVFP4Recipe:
    r"""NVFP4 training: E2M1 elements, an E4M3 scale per 16 elements, an FP32 tensor scale.

    $S_{enc} = 6 \cdot 448 / \mathrm{amax}(t)$, block scale
    $s_b = \mathrm{e4m3}(\mathrm{amax}_b / 6 \cdot S_{enc})$, elements
    $\mathrm{e2m1}(x \cdot S_{enc} / s_b)$, value $\mathrm{e2m1}(\dots) \cdot s_b / S_{enc}$
    ([nvfp4_scales][normlab.precision.block_scales.nvfp4_scales] has the float32 order).

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
            _check_bool(getattr(self, name), name)
        check_int(self.seed, "seed")

    def format_for(self, role: str) -> Format:
        """E2M1 for every operand."""
        return get_format("fp4")


@dataclass(frozen=True)
class BlockwiseFp8Recipe:
    r"""Blockwise FP8 (DeepSeek-V3; TE `Float8BlockScaling`): a float32 scale per tile.

    Per tile $s = m_{fp8} / \max(\mathrm{amax}_b, \epsilon)$ in float32 (1 for a tile whose
    amax is 0, inf or NaN; the input dtype's max when the quotient overflows), a power of
    two with `power_of_2_scales`; activations and gradients use 1 x `block_size` tiles
    along each GEMM's contraction, weights `block_size` x `block_size` tiles (so W and W^T
    agree).

    Attributes
    ----------
    block_size : int
        The tile length. Default 128.
    fp8_format : {"E4M3", "E5M2", "HYBRID"}
        Default `"E4M3"` for every operand.
    power_of_2_scales : bool
        Round scales down to powers of two. Default False.
    amax_epsilon : float
        Lower bound $\epsilon \ge 0$ on each tile's amax. Default 0.
    """

    block_size: int = 128
    fp8_format: str = "E4M3"
    power_of_2_scales: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.block_size, "block_size", minimum=1)
        _upper_fp8_format(self)
        _check_bool(self.power_of_2_scales, "power_of_2_scales")
        _check_epsilon(self.amax_epsilon)

    def format_for(self, role: str) -> Format:
        """E4M3 (default) for every operand, or as `fp8_format` says."""
        return fp8_format_for(self.fp8_format, role)


Recipe = (Bf16Recipe | Fp8DelayedRecipe | Fp8CurrentRecipe | MXRecipe | NVFP4Recipe
          | BlockwiseFp8Recipe)
"""Any training recipe."""

RECIPES: tuple[type, ...] = (Bf16Recipe, Fp8DelayedRecipe, Fp8CurrentRecipe, MXRecipe,
                             NVFP4Recipe, BlockwiseFp8Recipe)
"""The training recipes, in the order the documentation lists them."""


def check_recipe(recipe: object) -> Recipe:
    """`recipe` if it is one of [RECIPES][normlab.precision.recipes.RECIPES].

    Raises
    ------
    TypeError
        Otherwise (the message lists the recipes).
    """
    if not isinstance(recipe, RECIPES):
        names = ", ".join(r.__name__ for r in RECIPES)
        raise TypeError(f"recipe must be one of {names}; got {recipe!r}")
    return recipe  # type: ignore[return-value]
