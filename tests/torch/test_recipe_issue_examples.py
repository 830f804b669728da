"""The cases that showed QuantLinear's old copies wrong, now equal to the public functions.

Expected values: the NumPy ``Fp8Meta`` (TE 2.x's fused update, verified against TE's kernel
loop in ``tests/precision/test_fp8_delayed_update.py``), worked by hand where short, and
``mx_quantize``; tolerance 0.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import normlab.precision as P  # noqa: E402
import normlab.torch as nt  # noqa: E402
from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch import recipes as torch_recipes  # noqa: E402
from normlab.torch.training._gemm import quantize_operand  # noqa: E402


def _trace(recipe, amaxes: list[float]) -> tuple[list[float], list[float]]:
    """(layer scales, Fp8Meta scales) of operand x after each step of the trace."""
    layer = QuantLinear(4, 2, recipe=recipe)
    meta = P.Fp8Meta(recipe)
    got, want = [], []
    for a in amaxes:
        x = np.array([[a, 1.0 if math.isnan(a) else 0.0, 0.0, 0.0]], np.float32)
        quantize_operand(layer, torch.from_numpy(x), "x", 1)
        layer.update_scales()
        meta.quantize(x)
        meta.update()
        got.append(float(layer.scale[0]))
        want.append(meta.scale)
    return got, want


def test_history_two_amaxes_10_0_1_give_44_8() -> None:
    # fused: step 1 rolls [10, 0] -> scale 448/10; step 2 (amax 0) keeps all; step 3 sees
    # 10 still in the window. The old unfused copy forgot 10 at step 3: 448.
    fused = P.Fp8DelayedRecipe(amax_history_len=2, reduce_amax=False)
    got, want = _trace(fused, [10.0, 0.0, 1.0])
    assert got == want == [float(np.float32(44.8))] * 3
    unfused = P.Fp8DelayedRecipe(amax_history_len=2, update="unfused", reduce_amax=False)
    got, want = _trace(unfused, [10.0, 0.0, 1.0])
    assert got == want and got[-1] == 448.0


def test_one_nan_batch_does_not_freeze_the_scale() -> None:
    recipe = P.Fp8DelayedRecipe(reduce_amax=False)  # history 1024
    got, want = _trace(recipe, [2.0, math.nan, 4.0, 8.0])
    assert got == want == [224.0, 224.0, 112.0, 56.0]  # the NaN is skipped, as fmaxf does
    unfused = P.Fp8DelayedRecipe(update="unfused", reduce_amax=False)
    got, want = _trace(unfused, [2.0, math.nan, 4.0, 8.0])
    assert got == want == [224.0] * 4  # TE's unfused path keeps it while the NaN is there


@pytest.mark.parametrize("rule", ["ocp", "round_up"])
def test_mx_operand_of_a_block_holding_inf_is_mx_quantize(rule: str) -> None:
    x = np.linspace(-2.0, 2.0, 64, dtype=np.float32).reshape(2, 32)
    x[0, 3] = np.inf
    layer = QuantLinear(32, 2, recipe=P.MXRecipe(scale_rule=rule))
    got = quantize_operand(layer, torch.from_numpy(x), "x", 1).numpy()
    want = P.mx_quantize(x, "e4m3", scale_rule=rule).dequantize()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if rule == "ocp":
        assert np.isnan(got[0]).all() and not np.isnan(got[1]).any()


def test_torch_blockwise_bfloat16_overflow_uses_bfloat16_max() -> None:
    t = torch.full((1, 128), 1e-37, dtype=torch.bfloat16)
    q = nt.blockwise_quantize(t)
    assert q.scales.item() == float(torch.finfo(torch.bfloat16).max)
    assert f"{q.scale_inv.item():.6g}" == "2.95026e-39"
    want = P.blockwise_quantize(np.full((1, 128), 1e-37, ml_dtypes.bfloat16))
    assert q.scale_inv.item() == float(want.scale_inv[0, 0])


def test_recipes_are_one_set_of_classes() -> None:
    for name in torch_recipes.__all__:
        assert getattr(torch_recipes, name) is getattr(P.recipes, name)
    for name in ("Fp8DelayedRecipe", "MXRecipe", "NVFP4Recipe", "BlockwiseFp8Recipe"):
        assert getattr(nt, name) is getattr(P, name)


@pytest.mark.parametrize(("margin", "eps"), [(-500, 0.0), (500, 0.0), (0, 1e300), (3, 1e-45)])
def test_extreme_settings_agree(margin: int, eps: float) -> None:
    # constants beyond float32's range round to inf (or 0) on both sides, never raise
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    want = P.quantize_current_scaling(x, margin=margin, amax_epsilon=eps)
    got = nt.quantize_current_scaling(torch.from_numpy(x), margin=margin, amax_epsilon=eps)
    assert got.scale.item() == want.scale
    np.testing.assert_array_equal(got.data.numpy(), want.data)
    bw = P.blockwise_quantize(x, block_shape=(1, 32), amax_epsilon=eps)
    bt = nt.blockwise_quantize(torch.from_numpy(x), block_shape=(1, 32), amax_epsilon=eps)
    np.testing.assert_array_equal(bt.scales.numpy(), bw.scales)
