"""The FP8 training recipes: per-tensor delayed and current scaling, row-wise, blockwise.

Settings only, as every recipe of [normlab.precision.scaled.recipes][] (which re-exports these);
each names its operands' quantizers in `make_quantizer`
(`normlab.precision.scaled.quantizers`). Sources: Micikevicius et al., "FP8 Formats for Deep
Learning", 2022 (Transformer Engine's `DelayedScaling` and `Float8CurrentScaling`);
torchao's `Float8LinearRecipeName.ROWWISE` and `ROWWISE_WITH_GW_HP`; DeepSeek-AI,
"DeepSeek-V3 Technical Report", 2024 (blockwise FP8; TE `Float8BlockScaling`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from normlab._validate import check_int
from normlab.precision.formats.format import Format
from normlab.precision.scaled import scales
from normlab.precision.scaled.quantizers import (
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    IdentityQuantizer,
    Quantizer,
)
from normlab.precision.scaled.recipe import (
    Recipe,
    check_bool,
    check_epsilon,
    grad_role,
    upper_fp8_format,
)
from normlab.precision.scaled.recipe_formats import AMAX_ALGOS, fp8_format_for
from normlab.precision.scaled.scales import UPDATES

__all__ = [
    "ROWWISE_EPSILON",
    "BlockwiseFp8Recipe",
    "DelayedScaling",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "Fp8RowwiseRecipe",
]


@dataclass(frozen=True)
class Fp8DelayedRecipe(Recipe):
    r"""Transformer Engine's delayed scaling: per-tensor scales from an amax history.

    One class serves [Fp8Meta][normlab.precision.Fp8Meta] and the training layer
    (`DelayedScaling` is another name for it, Transformer Engine's).

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
    the window); [delayed_update][normlab.precision.scaled.scales.delayed_update] states both.

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
    reduce_amax : bool
        All-reduce the amaxes with MAX over the process group (TE's
        `amax_reduction_group`) before a scale update, so every rank uses the same scales.
        Default True. Keyword-only. Used by the training layer only.

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
    reduce_amax: bool = field(default=True, kw_only=True)

    delayed: ClassVar[bool] = True
    """Per-tensor scales come from an amax history updated once per step."""

    def __post_init__(self) -> None:
        check_int(self.margin, "margin")
        check_int(self.amax_history_len, "amax_history_len", minimum=1)
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_ALGOS}; "
                             f"got {self.amax_compute_algo!r}")
        upper_fp8_format(self)
        if self.update not in UPDATES:
            raise ValueError(f"update must be one of {UPDATES}; got {self.update!r}")
        check_bool(self.reduce_amax, "reduce_amax")

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a `"forward"` operand (x, W) or a `"backward"` one (dy)."""
        return fp8_format_for(self.fp8_format, role)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """One per-tensor scale per operand, from the layer's delayed-scaling state."""
        return Fp8TensorQuantizer(self.format_for(grad_role(role)))

    def delayed_update(self, history: Any, scale: Any, fmt: Format, *,
                       xp: Any) -> tuple[Any, Any]:
        """[delayed_update][normlab.precision.scaled.scales.delayed_update] with these settings."""
        return scales.delayed_update(history, scale, fmt.max, margin=self.margin,
                                     amax_compute_algo=self.amax_compute_algo,
                                     update=self.update, xp=xp)

    def delayed_scaling(self) -> Fp8DelayedRecipe:
        """These settings (kept for code written when `DelayedScaling` was a separate class)."""
        return self


DelayedScaling = Fp8DelayedRecipe
"""Transformer Engine's name for [Fp8DelayedRecipe][normlab.precision.Fp8DelayedRecipe]."""


@dataclass(frozen=True)
class Fp8CurrentRecipe(Recipe):
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
        upper_fp8_format(self)
        check_int(self.margin, "margin")
        check_bool(self.reduce_amax, "reduce_amax")
        check_epsilon(self.amax_epsilon)
        check_bool(self.power_of_2_scales, "power_of_2_scales")

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a `"forward"` operand (x, W) or a `"backward"` one (dy)."""
        return fp8_format_for(self.fp8_format, role)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """One per-tensor scale per operand, from its own amax."""
        return Fp8TensorQuantizer(self.format_for(grad_role(role)))

    def scale_from_amax(self, amax: Any, fmt: Format, *, xp: Any) -> Any:
        """[scale_from_amax][normlab.precision.scaled.scales.scale_from_amax], these settings."""
        return scales.scale_from_amax(amax, fmt.max, margin=self.margin,
                                      epsilon=self.amax_epsilon,
                                      power_of_2_scales=self.power_of_2_scales, xp=xp)


ROWWISE_EPSILON = 1e-12
"""The amax lower bound of the rowwise recipes (torchao's `EPS`)."""


@dataclass(frozen=True)
class Fp8RowwiseRecipe(Recipe):
    r"""Row-wise FP8 (torchao's `rowwise` and `rowwise_with_gw_hp`): a scale per row.

    Every FP8 operand is E4M3 with one float32 scale per slice along its GEMM's contraction
    axis (x and dy per row of the forward and dgrad GEMMs, W per output row in forward,
    per input column in dgrad, x and dy per column in wgrad),

    $$
    s = 2^{\lfloor \log_2 (448 / \max(\mathrm{amax}, 10^{-12})) \rfloor},
    $$

    elements $\mathrm{sat\_round}(t\,s)$, values $\mathrm{elements} / s$; a slice holding
    an inf or a NaN becomes all NaN (torchao's scale is 0 or NaN there).

    Attributes
    ----------
    grad_weight_high_precision : bool
        False: torchao `rowwise`, all three GEMMs in row-wise FP8. True: torchao
        `rowwise_with_gw_hp`: the output from row-wise x and W, the input gradient from
        row-wise dy and W scaled per tensor (the same power-of-two rule over the whole
        weight), the weight gradient from the unquantised x and dy. Default False.

    Notes
    -----
    When to choose it: the recipe of large FP8 runs in the PyTorch ecosystem. A scale per
    row follows outlier rows that one per-tensor scale cannot, without MX's or NVFP4's
    block scales; `grad_weight_high_precision=True` is torchao's most accurate FP8 recipe.
    Scales are local to each row, so nothing is all-reduced across ranks.
    """

    grad_weight_high_precision: bool = False

    def __post_init__(self) -> None:
        check_bool(self.grad_weight_high_precision, "grad_weight_high_precision")

    def format_for(self, role: str) -> Format:
        """E4M3 for every operand."""
        return fp8_format_for("E4M3", role)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """Row-wise E4M3 along the contraction axis; with `grad_weight_high_precision`, W
        per tensor in dgrad and the unquantised x and dy in wgrad."""
        fmt = self.format_for(grad_role(role))
        if self.grad_weight_high_precision and axis == 0:
            if role == "w":  # dgrad: W contracted along N, one scale for the tensor
                return Fp8TensorQuantizer(fmt)
            return IdentityQuantizer()  # wgrad: x and dy as they are
        return Fp8BlockQuantizer(fmt, axis, 0, pow2=True, epsilon=ROWWISE_EPSILON,
                                 nonfinite_nan=True)

    def scale_from_amax(self, amax: Any, fmt: Format, *, xp: Any) -> Any:
        """The per-tensor scale of W in dgrad (`grad_weight_high_precision`): the row rule
        over the whole tensor."""
        return scales.scale_from_amax(amax, fmt.max, epsilon=ROWWISE_EPSILON,
                                      power_of_2_scales=True,
                                      previous=xp.scalar(float("nan"), amax), xp=xp)


@dataclass(frozen=True)
class BlockwiseFp8Recipe(Recipe):
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
        upper_fp8_format(self)
        check_bool(self.power_of_2_scales, "power_of_2_scales")
        check_epsilon(self.amax_epsilon)

    def format_for(self, role: str) -> Format:
        """E4M3 (default) for every operand, or as `fp8_format` says."""
        return fp8_format_for(self.fp8_format, role)

    def make_quantizer(self, role: str, axis: int) -> Quantizer:
        """1 x `block_size` tiles along the contraction axis; square weight tiles."""
        return Fp8BlockQuantizer(self.format_for(grad_role(role)), axis, self.block_size,
                                 tile=role == "w", pow2=self.power_of_2_scales,
                                 epsilon=self.amax_epsilon)
