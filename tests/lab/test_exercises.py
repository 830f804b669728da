"""Exercises 16.1-16.4: each prints a live demonstration whose numbers say what they should."""

from __future__ import annotations

import re

import pytest

from normlab.lab.exercises import EXERCISES, exercise_text


def _number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*=?\s*([-+0-9.e]+)", text)
    assert match, f"{label!r} not found in:\n{text}"
    return float(match.group(1))


def test_every_exercise_prints_a_titled_demonstration():
    assert list(EXERCISES) == ["16.1", "16.2", "16.3", "16.4"]
    for number in EXERCISES:
        text = exercise_text(number)
        assert text.startswith(f"Exercise {number}:") and len(text.splitlines()) >= 6


def test_16_1_batchnorm_depends_on_the_batch_layernorm_does_not():
    text = exercise_text("16.1")
    assert "shape (5,)" in text and "shape (4, 1)" in text  # the reduced axes' statistics
    assert _number_after("BatchNorm (training) max difference:", text) > 0.1
    assert _number_after("LayerNorm            max difference:", text) == 0.0


def test_16_2_formula_matches_finite_differences_and_the_library():
    text = exercise_text("16.2")
    # central differences with h = 1e-6 in float64: truncation ~h^2, rounding ~1e-16/h = 1e-10
    assert _number_after("max |formula - central differences (h = 1e-6)| =", text) < 1e-7
    # same formula, same float64 arithmetic up to reassociation
    assert _number_after("max |formula - layer_norm_backward|            =", text) < 1e-12


def test_16_3_scale_invariance_and_identity_path():
    text = exercise_text("16.3")
    assert _number_after("row 0 scaled by 37.5: max |change| =", text) < 1e-14  # a few ulps
    assert "dx == dout exactly: True" in text


def test_16_4_dropout_overflow_and_loss_scaling():
    text = exercise_text("16.4")
    # 200000 Bernoulli(0.75) draws: standard error of the kept fraction ~1e-3
    assert abs(_number_after("kept fraction", text) - 0.75) < 0.005
    assert "float16  -> [inf inf]" in text
    assert re.search(r"bfloat16 -> \[9\.984\d*e\+04 1\.000\d*e\+30\]", text)
    assert "without scaling -> [0. 0.]" in text
    recovered = re.search(r"unscaled in fp32 -> \[([^\]]+)\]", text)
    assert recovered
    values = [float(v) for v in recovered.group(1).split()]
    # fp16 keeps 11 significant bits of g * 2^16: relative error <= 2^-11 (subnormals: less)
    assert values[0] == pytest.approx(1e-8, rel=2e-3) and values[1] == pytest.approx(3e-9, rel=2e-2)


def test_unknown_exercise_lists_the_available_ones():
    with pytest.raises(ValueError, match=re.escape("16.1, 16.2, 16.3, 16.4")):
        exercise_text("16.5")
