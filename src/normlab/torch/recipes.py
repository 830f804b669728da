"""Training recipes for :class:`normlab.torch.nn.QuantLinear`: which format each GEMM operand
gets, how it is scaled, and along which blocks.

Contract: a recipe is a frozen dataclass (settings only, hashable, comparable). The state a
recipe needs (delayed scaling's amax history and scales) lives in the layer that uses it.
A linear layer runs three GEMMs, and each quantises its two operands with blocks along
*that* GEMM's contraction dimension (the layout tensor cores read):

    forward   y  = x W^T    x (M,K) blocked along K,  W (N,K) blocked along K
    dgrad     dx = dy W     dy (M,N) blocked along N, W (N,K) blocked along N
    wgrad     dW = dy^T x   dy (M,N) blocked along M, x (M,K) blocked along M

Per-tensor recipes (delayed and current scaling) give the same values whatever the
axis. Products accumulate in float32.

Sources: Micikevicius et al., "FP8 Formats for Deep Learning", 2022 (E4M3 forward, E5M2
gradients, per-tensor scaling; Transformer Engine's ``DelayedScaling``); Rouhani et al.,
"Microscaling Data Formats for Deep Learning", 2023 (MX: one E8M0 scale per 32 elements);
NVIDIA, "Pretraining Large Language Models with NVFP4", 2025 (E2M1 elements, E4M3 scale per
16 elements, an FP32 tensor scale, 16x16 weight blocks, stochastic rounding of gradients, a
random Hadamard transform on the weight-gradient inputs); DeepSeek-AI, "DeepSeek-V3
Technical Report", 2024 (blockwise FP8: 1x128 activation and 128x128 weight tiles).

Example
-------
>>> Fp8DelayedRecipe().format_for("backward").name
'float8_e5m2'
>>> NVFP4Recipe(hadamard=False).hadamard
False
"""

from __future__ import annotations

from dataclasses import dataclass

from normlab._validate import check_int
from normlab.precision.formats import Format, get_format
from normlab.precision.fp8_scaling import DelayedScaling

__all__ = [
    "RECIPES",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "MXRecipe",
    "NVFP4Recipe",
    "Recipe",
    "check_recipe",
]

_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")


def _check_bool(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {value!r}")


def _check_fp8_format(recipe: object, value: str) -> None:
    if not isinstance(value, str) or value.upper() not in _FP8_FORMATS:
        raise ValueError(f"fp8_format must be one of {_FP8_FORMATS}; got {value!r}")
    object.__setattr__(recipe, "fp8_format", value.upper())


@dataclass(frozen=True)
class Bf16Recipe:
    """The 16-bit baseline: every operand rounded to nearest bfloat16, float32 accumulate.

    Parameters
    ----------
    fmt: the operand format (default ``"bf16"``; ``"fp16"`` or any normlab format works).
    """

    fmt: str = "bf16"

    def __post_init__(self) -> None:
        get_format(self.fmt)  # raises ValueError naming the format


@dataclass(frozen=True)
class Fp8DelayedRecipe:
    """Transformer Engine's ``DelayedScaling``: per-tensor scales from an amax history.

    ``scale = fp8_max / amax / 2^margin`` with amax the max over the last
    ``amax_history_len`` steps (``"max"``) or the last step (``"most_recent"``); the scale
    a step uses was computed from earlier steps (see :mod:`normlab.precision.fp8_scaling`).
    HYBRID (default): E4M3 for x and W, E5M2 for gradients. ``reduce_amax``: all-reduce the
    amaxes with MAX over the process group (TE's ``amax_reduction_group``) before a scale
    update, so every rank uses the same scales.
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_format: str = "HYBRID"
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        _check_fp8_format(self, self.fp8_format)
        _check_bool(self.reduce_amax, "reduce_amax")
        self.delayed_scaling()  # validates margin, history length and algorithm

    def delayed_scaling(self) -> DelayedScaling:
        """The NumPy recipe with the same settings (the specification of the state)."""
        return DelayedScaling(self.margin, self.amax_history_len, self.amax_compute_algo,
                              self.fp8_format)

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a ``"forward"`` operand (x, W) or a ``"backward"`` one (dy)."""
        return self.delayed_scaling().format_for(role)


@dataclass(frozen=True)
class Fp8CurrentRecipe:
    """Per-tensor current scaling: ``scale = fp8_max / amax(t) / 2^margin`` of each operand.

    ``reduce_amax``: the operand's amax is all-reduced with MAX over the process group before
    the scale is computed (so ranks agree, as a one-process run on the whole batch would).
    """

    margin: int = 0
    fp8_format: str = "HYBRID"
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        _check_fp8_format(self, self.fp8_format)
        check_int(self.margin, "margin")
        _check_bool(self.reduce_amax, "reduce_amax")

    def format_for(self, role: str) -> Format:
        """E4M3 or E5M2 for a ``"forward"`` operand (x, W) or a ``"backward"`` one (dy)."""
        return DelayedScaling(fp8_format=self.fp8_format).format_for(role)


@dataclass(frozen=True)
class MXRecipe:
    """OCP Microscaling: one E8M0 (power-of-two) scale per ``block_size`` elements.

    The scale of a block is ``2^(floor(log2 amax) - emax_elem)`` (the OCP rule of
    :func:`normlab.precision.mx_quantize`); elements are rounded to nearest with saturation.
    ``elem`` is the element format of x and W, ``grad_elem`` that of dy (default: elem).
    """

    elem: str = "e4m3"
    grad_elem: str | None = None
    block_size: int = 32

    def __post_init__(self) -> None:
        get_format(self.elem)
        if self.grad_elem is not None:
            get_format(self.grad_elem)
        check_int(self.block_size, "block_size", minimum=1)

    def format_for(self, role: str) -> Format:
        """The element format of a ``"forward"`` or ``"backward"`` operand."""
        if role == "backward" and self.grad_elem is not None:
            return get_format(self.grad_elem)
        return get_format(self.elem)


@dataclass(frozen=True)
class NVFP4Recipe:
    """NVFP4 training: E2M1 elements, an E4M3 scale per 16 elements, an FP32 tensor scale.

    Tensor scale ``s = 6 * 448 / amax(t)``; block scale ``S_b = e4m3(amax_b / 6 * s)``;
    elements ``e2m1(x * s / S_b)``; value ``e2m1(...) * S_b / s``. The three parts of the
    recipe, each switchable: ``two_d_weights`` (16x16 weight blocks, so W and W^T quantise
    identically in forward and dgrad; else 1x16 along each GEMM's contraction),
    ``stochastic_gradients`` (dy rounded stochastically in both backward GEMMs),
    ``hadamard`` (a 16x16 random Hadamard transform with random signs applied to both
    wgrad inputs along M; it cancels in dy^T x exactly, spreading outliers before rounding).
    ``seed`` fixes the Hadamard signs and the stochastic-rounding streams.
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
    """Blockwise FP8 (DeepSeek-V3): float32 scale ``448 / amax`` per tile, E4M3 elements.

    Activations and gradients use 1 x ``block_size`` tiles along each GEMM's contraction
    dimension, weights ``block_size x block_size`` tiles (so W and W^T agree).
    """

    block_size: int = 128
    fp8_format: str = "E4M3"

    def __post_init__(self) -> None:
        check_int(self.block_size, "block_size", minimum=1)
        _check_fp8_format(self, self.fp8_format)

    def format_for(self, role: str) -> Format:
        """E4M3 (default) for every operand, or as ``fp8_format`` says."""
        return DelayedScaling(fp8_format=self.fp8_format).format_for(role)


Recipe = (Bf16Recipe | Fp8DelayedRecipe | Fp8CurrentRecipe | MXRecipe | NVFP4Recipe
          | BlockwiseFp8Recipe)

RECIPES: tuple[type, ...] = (Bf16Recipe, Fp8DelayedRecipe, Fp8CurrentRecipe, MXRecipe,
                             NVFP4Recipe, BlockwiseFp8Recipe)


def check_recipe(recipe: object) -> Recipe:
    """Return ``recipe`` if it is one of :data:`RECIPES`, else raise TypeError."""
    if not isinstance(recipe, RECIPES):
        names = ", ".join(r.__name__ for r in RECIPES)
        raise TypeError(f"recipe must be one of {names}; got {recipe!r}")
    return recipe  # type: ignore[return-value]
