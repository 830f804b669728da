"""QuantLinear's extra state is checked as the NumPy Fp8Meta's state is, and loads all or nothing.

A scale of inf made the layer's outputs finite but wrong, NaN and 0 made them NaN; the
NumPy `Fp8Meta.load_state_dict` refuses each. The oracle of "nothing changed" is the
layer's own state before the load, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import DelayedScaling, Fp8Meta  # noqa: E402
from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch.recipes import Fp8CurrentRecipe, Fp8DelayedRecipe  # noqa: E402
from normlab.torch.training._extra_state import unpack_extra_state  # noqa: E402


def _layer(recipe) -> QuantLinear:
    torch.manual_seed(0)
    layer = QuantLinear(16, 8, recipe=recipe)
    layer(torch.randn(4, 16)).sum().backward()
    layer(torch.randn(4, 16)).sum().backward()  # the scales updated once
    return layer


def _state(layer: QuantLinear) -> dict:
    return unpack_extra_state(layer.get_extra_state())


def _bits(state: dict) -> dict:
    return {k: v.numpy().tobytes() if isinstance(v, torch.Tensor) else v
            for k, v in state.items()}


BAD = [
    ("scale", math.inf, "'scale'"),
    ("scale", math.nan, "'scale'"),
    ("scale", 0.0, "'scale'"),
    ("scale", -2.0, "'scale'"),
    ("amax_history", -1.0, "'amax_history'.*>= 0"),
    ("amax_history", -math.inf, "'amax_history'.*>= 0"),
]


CASES = [("delayed", *bad) for bad in BAD] + [  # current scaling keeps no amax history
    ("current", *bad) for bad in BAD if bad[0] == "scale"]


@pytest.mark.parametrize(("recipe", "key", "value", "match"), CASES)
def test_a_bad_value_is_refused_and_nothing_changes(recipe, key, value, match):
    layer = _layer(Fp8DelayedRecipe(amax_history_len=4) if recipe == "delayed"
                   else Fp8CurrentRecipe())
    before = _bits(_state(layer))
    state = _state(layer)
    state["pending"] = not state["pending"]  # applied first before: must not leak in now
    state["rounding_step"] = 12345
    state[key] = state[key].clone()
    state[key].view(-1)[-1] = value
    with pytest.raises(ValueError, match=match):
        layer.set_extra_state(state)
    assert _bits(_state(layer)) == before


def test_the_numpy_meta_refuses_the_same_values():
    # the twin's rules: what the layer refuses, Fp8Meta.load_state_dict refuses too
    for key, value, _ in BAD:
        meta = Fp8Meta(DelayedScaling(amax_history_len=4))
        state = meta.state_dict()
        if key == "scale":
            state["scale"] = value
        else:
            state["amax_history"] = np.array([0.0, 1.0, 2.0, value], np.float32)
        with pytest.raises(ValueError, match=key):
            meta.load_state_dict(state)


def test_nan_and_inf_amaxes_that_a_step_records_round_trip():
    # a NaN input sticks in slot 0 until the update rolls it; a state saved then must load
    layer = _layer(Fp8DelayedRecipe(amax_history_len=4))
    x = torch.randn(4, 16)
    x[0, 0] = math.nan
    layer(x)
    state = _state(layer)
    assert torch.isnan(state["amax_history"]).any()
    state["amax_history"][1, 1] = math.inf
    other = _layer(Fp8DelayedRecipe(amax_history_len=4))
    other.set_extra_state(state)
    assert _bits(_state(other)) == _bits(state)
    meta = Fp8Meta(DelayedScaling(amax_history_len=4))
    meta.quantize(np.array([np.nan, 1.0], np.float32))
    loaded = Fp8Meta(DelayedScaling(amax_history_len=4))
    loaded.load_state_dict(meta.state_dict())
    np.testing.assert_array_equal(loaded.amax_history, meta.amax_history)


def test_pending_and_rounding_step_are_checked():
    layer = _layer(Fp8DelayedRecipe(amax_history_len=4))
    before = _bits(_state(layer))
    for key, value, exc in (("pending", "yes", TypeError), ("rounding_step", -1, ValueError),
                            ("rounding_step", 1.5, ValueError)):
        state = _state(layer)
        state[key] = value
        with pytest.raises(exc, match=key):
            layer.set_extra_state(state)
        assert _bits(_state(layer)) == before
