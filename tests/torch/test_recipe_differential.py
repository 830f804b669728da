"""The differential suite: for every recipe and every GEMM operand, NumPy = torch = QuantLinear
= the independent oracle, bit for bit (tolerance 0, NaN bit patterns included).

The harness is `recipe_differential.py`: 14 recipe settings x 7 input kinds x 6 operands
(x, W in forward; dy, W in dgrad; dy, x in wgrad) with five paths each (QuantLinear by its
CPU fast path and by the shared arithmetic in torch ops), as float32 and bfloat16 models;
delayed scaling over amax traces with zero, NaN and inf steps for history lengths 1, 2, 4
and 1024, both algorithms, both updates and three margins; bfloat16 input to blockwise
FP8. The inputs hit zero blocks and a zero 16 x 16 tile, NaN and inf inside blocks,
ragged shapes (40 x 72, 56 x 72, 40 x 56 against blocks of 16, 32 and 128), E4M3 and E2M1
ties under power-of-two scales, float32 subnormals, a subnormal tensor amax and amaxes
near FLT_MAX.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import recipe_differential as diff  # noqa: E402

from normlab.precision import Fp8DelayedRecipe  # noqa: E402


@pytest.mark.parametrize("kind", diff.INPUTS)
@pytest.mark.parametrize("recipe", sorted(diff.RECIPES))
def test_operands_agree(recipe: str, kind: str) -> None:
    assert diff.operand_mismatches(recipe, kind) == []


@pytest.mark.parametrize("kind", diff.INPUTS)
@pytest.mark.parametrize("recipe", sorted(diff.RECIPES))
def test_bf16_model_operands_agree(recipe: str, kind: str) -> None:
    # the layer reads bfloat16 operands (the fast path in place, 16-bit patterns); every
    # other path sees their float32 values
    assert diff.operand_mismatches(recipe, kind, "bfloat16") == []


@pytest.mark.parametrize("margin", [0, 2, -3])
@pytest.mark.parametrize("update", ["fused", "unfused"])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("history", [1, 2, 4, 1024])
def test_delayed_scaling_agrees(history: int, algo: str, update: str, margin: int) -> None:
    recipe = Fp8DelayedRecipe(margin=margin, amax_history_len=history, amax_compute_algo=algo,
                              update=update, reduce_amax=False)
    for name, trace in diff.TRACES.items():
        assert diff.delayed_mismatches(recipe, trace) == [], name


@pytest.mark.parametrize("kind", diff.INPUTS)
def test_bf16_input_to_blockwise_agrees(kind: str) -> None:
    assert diff.bf16_blockwise_mismatches(kind) == []
