"""The recipe settings: one module, frozen and validated, formats without a detour.

Expected values are the recipes' definitions (TE's HYBRID: E4M3 forward, E5M2 gradients;
the documented defaults); errors must name the field and the value.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import normlab.precision as P
from normlab.precision.formats.format import FLOAT4_E2M1FN, FLOAT8_E4M3FN, FLOAT8_E5M2
from normlab.precision.scaled import recipes

ALL = (recipes.DelayedScaling(), *(r() for r in recipes.RECIPES))


@pytest.mark.parametrize("recipe", ALL, ids=lambda r: type(r).__name__)
def test_recipes_are_frozen_hashable_settings(recipe) -> None:
    assert dataclasses.is_dataclass(recipe) and hash(recipe) == hash(dataclasses.replace(recipe))
    field = dataclasses.fields(recipe)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(recipe, field, getattr(recipe, field))
    assert getattr(P, type(recipe).__name__) is type(recipe)  # exported by normlab.precision


def test_formats_by_role() -> None:
    for r in (recipes.DelayedScaling(), recipes.Fp8DelayedRecipe(), recipes.Fp8CurrentRecipe()):
        assert r.format_for("forward") == FLOAT8_E4M3FN
        assert r.format_for("backward") == FLOAT8_E5M2
    assert recipes.Fp8CurrentRecipe(fp8_format="e5m2").format_for("forward") == FLOAT8_E5M2
    assert recipes.BlockwiseFp8Recipe().format_for("backward") == FLOAT8_E4M3FN
    assert recipes.NVFP4Recipe().format_for("forward") == FLOAT4_E2M1FN
    mx = recipes.MXRecipe("int8", grad_elem="fp4")
    assert mx.format_for("forward") == recipes.MXINT8 and mx.format_for("backward").max == 6.0
    with pytest.raises(ValueError, match="role"):
        recipes.fp8_format_for("HYBRID", "sideways")


def test_no_recipe_builds_a_delayed_scaling_to_find_a_format(monkeypatch) -> None:
    def forbidden(*args, **kw):
        raise AssertionError("DelayedScaling built to look up a format")

    current, blockwise = recipes.Fp8CurrentRecipe(), recipes.BlockwiseFp8Recipe(fp8_format="HYBRID")
    monkeypatch.setattr(recipes.DelayedScaling, "__init__", forbidden)
    assert current.format_for("backward") == FLOAT8_E5M2
    assert blockwise.format_for("forward") == FLOAT8_E4M3FN


def test_delayed_training_recipe_is_a_delayed_scaling() -> None:
    # one class under two names (Transformer Engine's DelayedScaling and the training recipe)
    assert recipes.DelayedScaling is recipes.Fp8DelayedRecipe
    r = recipes.Fp8DelayedRecipe(2, 16, "most_recent", "e4m3", "unfused", reduce_amax=False)
    assert r.fp8_format == "E4M3" and r.delayed_scaling() is r
    assert r == recipes.DelayedScaling(2, 16, "most_recent", "E4M3", "unfused",
                                       reduce_amax=False)
    meta = P.Fp8Meta(r)  # the layer's state is this meta's
    meta.quantize(np.array([2.0], np.float32))
    meta.update()
    assert meta.scale == 224.0 / 4  # most recent amax 2, margin 2


def test_aliases_and_new_settings() -> None:
    assert recipes.MXRecipe(scale_rule="te").scale_rule == "round_up"
    assert recipes.MXRecipe(scale_rule="floor").scale_rule == "ocp"
    assert recipes.Fp8CurrentRecipe(amax_epsilon=1e-3, power_of_2_scales=True).amax_epsilon
    assert recipes.BlockwiseFp8Recipe(power_of_2_scales=True).power_of_2_scales


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: recipes.Fp8DelayedRecipe(update="sometimes"), ValueError, "update"),
    (lambda: recipes.Fp8DelayedRecipe(amax_history_len=0), ValueError, "amax_history_len"),
    (lambda: recipes.Fp8DelayedRecipe(0, 4, "max", "HYBRID", False), ValueError, "update"),
    (lambda: recipes.Fp8DelayedRecipe(reduce_amax=1), TypeError, "reduce_amax"),
    (lambda: recipes.Fp8CurrentRecipe(amax_epsilon=-1.0), ValueError, "amax_epsilon"),
    (lambda: recipes.Fp8CurrentRecipe(power_of_2_scales=1), TypeError, "power_of_2_scales"),
    (lambda: recipes.MXRecipe(scale_rule="up"), ValueError, "scale_rule"),
    (lambda: recipes.MXRecipe("e9m9"), ValueError, "e9m9"),
    (lambda: recipes.BlockwiseFp8Recipe(block_size=0), ValueError, "block_size"),
    (lambda: recipes.BlockwiseFp8Recipe(amax_epsilon=float("nan")), ValueError,
     "amax_epsilon"),
    (lambda: recipes.NVFP4Recipe(seed=1.5), TypeError, "seed"),
    (lambda: recipes.check_recipe("fp8"), TypeError, "recipe must be one of"),
])
def test_bad_settings(make, error, match) -> None:
    with pytest.raises(error, match=match):
        make()


def test_blockwise_bfloat16_overflow_uses_bfloat16_max() -> None:
    # Transformer Engine's compute_scale_from_types: 448 / 1e-37 overflows float32, and the
    # scale becomes bfloat16's max 0x1.fep+127 = 3.3895314e38, so scale_inv = 2.95026e-39
    x = np.full((1, 128), 1e-37, dtype=ml_dtypes.bfloat16)
    t = P.blockwise_quantize(x)
    bf16_max = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert t.scales[0, 0] == bf16_max
    assert t.scale_inv[0, 0] == np.float32(1.0) / bf16_max
    assert f"{float(t.scale_inv[0, 0]):.6g}" == "2.95026e-39"
    # float32 input keeps float32's max (the quotient overflows there too)
    f32 = P.blockwise_quantize(x.astype(np.float32))
    assert f32.scales[0, 0] == np.finfo(np.float32).max
    assert f"{float(f32.scale_inv[0, 0]):.7g}" == "2.938736e-39"
