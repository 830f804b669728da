"""Every training recipe with its settings: the one table the recipe tests take.

`TRAINING` holds each recipe once, with the settings the layer and workflow tests train with
(QuantLinear, convert, checkpointing, compile, inductor, Hugging Face, saved codes,
operand layouts). `VARIANTS` adds the settings that exercise each option of a recipe
(formats, scale rules, margins, epsilons, block sizes, switched-off NVFP4 features): the
operand-level suites (the differential harness, the numba operand kernels) run over it.

A new recipe is one line in `TRAINING` (and its option variants here): every suite that
takes the table covers it. Suites that compare with an outside oracle (NumPy and torch
public functions, torchao, Transformer Engine's reference) also need the oracle of the new
recipe; their harnesses raise for a recipe they do not know.
"""

from __future__ import annotations

import dataclasses

from normlab.precision.scaled.recipes import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
)

TRAINING = {
    "bf16": Bf16Recipe(),
    "delayed": Fp8DelayedRecipe(amax_history_len=4),
    "current": Fp8CurrentRecipe(),
    "rowwise": Fp8RowwiseRecipe(),
    "rowwise_gw_hp": Fp8RowwiseRecipe(grad_weight_high_precision=True),
    "mx": MXRecipe(),
    "nvfp4": NVFP4Recipe(),
    "blockwise": BlockwiseFp8Recipe(block_size=32),
}
"""Each recipe once (blockwise FP8 with 32-element blocks, so small test layers hold
several)."""

VARIANTS = {
    **TRAINING,
    "fp16": Bf16Recipe("fp16"),
    "delayed_unfused": Fp8DelayedRecipe(amax_history_len=8, update="unfused"),
    "current_m3_eps_pow2": Fp8CurrentRecipe(margin=3, amax_epsilon=1e-3,
                                            power_of_2_scales=True),
    "current_e5m2_m-2": Fp8CurrentRecipe(margin=-2, fp8_format="E5M2"),
    "mx_e4m3_e5m2": MXRecipe("e4m3", grad_elem="e5m2"),
    "mx_fp4_round_up": MXRecipe("fp4", scale_rule="round_up"),
    "mx_int8_fp6_16": MXRecipe("int8", grad_elem="fp6_e3m2", block_size=16),
    "mx_e4m3_round_up": MXRecipe("e4m3", scale_rule="round_up"),
    "nvfp4_seed3": NVFP4Recipe(seed=3),
    "nvfp4_plain": NVFP4Recipe(two_d_weights=False, stochastic_gradients=False,
                               hadamard=False),
    "blockwise_16_pow2_eps": BlockwiseFp8Recipe(block_size=16, power_of_2_scales=True,
                                                amax_epsilon=1e-30, fp8_format="HYBRID"),
    "blockwise_128": BlockwiseFp8Recipe(),
}
"""`TRAINING` plus the settings that exercise each option."""


def operand_recipes(table: dict) -> dict:
    """The entries whose operands have no history: delayed scaling's operands depend on the
    steps before (its suites run amax traces instead)."""
    return {name: r for name, r in table.items() if not r.delayed}


def unreduced(table: dict) -> dict:
    """The entries with `reduce_amax=False` where a recipe has that setting (single-process
    tests that trace or compile the layer: no collective in the graph)."""
    return {name: (dataclasses.replace(r, reduce_amax=False)
                   if "reduce_amax" in {f.name for f in dataclasses.fields(r)} else r)
            for name, r in table.items()}
