"""The emulated-training bench section: checks that can fail, saved bytes, torchao's row.

No timing is asserted (speed is measured by the benchmark); only that every recipe was
checked, timed and measured, and that each check turns FAIL when the mechanism it checks
is broken.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

import normlab.torch as nt
from normlab.bench import command
from normlab.bench import training as tr
from normlab.bench import training_checks as checks
from normlab.bench import training_model as tm
from normlab.bench.memory import saved_bytes

_RECIPES = list(tm.recipes().items())


def _plain_linear(self, x):
    return torch.nn.functional.linear(x, self.weight, self.bias)


def test_saved_bytes_counts_distinct_storages_and_skips_the_excluded():
    w = torch.ones(4, 6, requires_grad=True)  # 96 bytes
    x = torch.ones(8, 4, requires_grad=True)  # 128 bytes
    # x @ w saves x (for dW) and w (for dx); relu saves its output (8x6, 192 bytes)
    _, n = saved_bytes(lambda: (x @ w).relu().sum())
    assert n == 128 + 96 + 192
    _, n = saved_bytes(lambda: (x @ w).relu().sum(), exclude=[w])
    assert n == 128 + 192
    # two views of one storage count once, with the storage's size
    big = torch.ones(16, 4, requires_grad=True)
    _, n = saved_bytes(lambda: (big[:8] @ w).sum() + (big[8:] @ w).sum(), exclude=[w])
    assert n == big.nbytes


def test_saved_bytes_within_modules_counts_only_what_they_save():
    lin = torch.nn.Linear(4, 6)
    model = torch.nn.Sequential(lin, torch.nn.ReLU())
    x = torch.ones(8, 4, requires_grad=True)  # 128 bytes: what the linear layer saves
    params = list(model.parameters())
    _, everything = saved_bytes(lambda: model(x).sum(), exclude=params)
    _, inside = saved_bytes(lambda: model(x).sum(), exclude=params, within=[lin])
    assert (everything, inside) == (128 + 8 * 6 * 4, 128)  # ReLU's output left out
    _, again = saved_bytes(lambda: model(x).sum(), exclude=params)
    assert again == everything  # the hooks are gone after the call


def test_linear_layers_save_their_inputs_unconverted_and_codes_under_fp8():
    # unconverted: fc1's and fc2's bf16 inputs; FP8 delayed: one byte a code plus the two
    # float32 scales (x's, W's) each layer keeps
    size = tm.ModelSize(tokens=32, width=16, hidden=48, blocks=2)
    plain = tm.Run.of(tm.build_model(size, torch.bfloat16), size)
    inputs = size.blocks * size.tokens * (size.width + size.hidden)
    assert tr._saved(plain, linear_only=True) == 2 * inputs
    fp8 = tm.Run.of(tm.convert(plain.model, nt.Fp8DelayedRecipe()), size)
    assert tr._saved(fp8, linear_only=True) == inputs + size.blocks * 2 * 2 * 4


def test_saved_bytes_per_token_cancel_what_does_not_grow_with_the_tokens():
    # per token the linear layers keep their inputs: 2 bytes an element unconverted, one
    # FP8 code; the two float32 scales each layer keeps do not grow with the tokens
    size = tm.ModelSize(tokens=32, width=16, hidden=48, blocks=2)
    plain = tm.build_model(size, torch.bfloat16)
    per_token = size.blocks * (size.width + size.hidden)
    assert tr._saved_per_token(plain, size, linear_only=True) == 2 * per_token
    fp8 = tm.convert(plain, nt.Fp8DelayedRecipe())
    assert tr._saved_per_token(fp8, size, linear_only=True) == per_token
    # the whole model adds LayerNorm's and GELU's bf16 inputs, the same converted or not
    whole = tr._saved_per_token(plain, size) - tr._saved_per_token(fp8, size)
    assert whole == per_token


def test_checkpointed_blocks_keep_their_input_and_fc2s_codes():
    # + checkpoint: per block the block's bf16 input (kept to recompute norm, fc1, GELU)
    # and fc2's FP8 codes with its two float32 scales; what the recomputed part saved in
    # the forward is not kept
    size = tm.ModelSize(tokens=32, width=16, hidden=48, blocks=2)
    plain = tm.Run.of(tm.build_model(size, torch.bfloat16), size)
    run = tm.Run.of(tm.checkpointed(tm.convert(plain.model, nt.Fp8DelayedRecipe())), size)
    per_block = size.tokens * size.width * 2 + size.tokens * size.hidden + 2 * 4
    assert tr._saved(run) == size.blocks * per_block
    assert tr._saved(run, linear_only=True) == size.blocks * (size.tokens * size.hidden + 8)


@pytest.mark.parametrize("name", tr.CHECKPOINTED)
def test_checkpoint_check_passes_and_fails_when_the_recompute_differs(name, monkeypatch):
    recipe = tm.recipes()[name]
    result = checks.checkpoint_check(recipe)
    assert result["passed"] and result["bit_identical"] and result["max_error"] == 0.0
    def drifting(self, x):  # the recomputed fc1 output (what GELU saves) 2^-10 off
        h = self.fc1(self.norm(x))
        if torch._C._current_graph_task_id() != -1:
            h = h * (1 + 2.0**-10)
        return torch.nn.functional.gelu(h)

    monkeypatch.setattr(tm.MLPBlock, "_hidden", drifting)
    broken = checks.checkpoint_check(recipe)
    assert not broken["passed"] and broken["max_error"] > 0.0


def test_unconverted_bf16_model_saves_its_activations():
    # per block: LayerNorm's input, fc1's input, GELU's input and fc2's input, bf16, plus
    # LayerNorm's per-row mean and rstd (bf16 or float32); parameters are excluded
    size = tm.ModelSize(tokens=32, width=16, hidden=48, blocks=2)
    run = tm.Run.of(tm.build_model(size, torch.bfloat16), size)
    _, n = saved_bytes(lambda: run.model(run.x), exclude=list(run.model.parameters()))
    acts = size.blocks * 2 * size.tokens * (2 * size.width + 2 * size.hidden)
    assert acts <= n <= acts + size.blocks * 2 * 4 * size.tokens
    section_saved = tr._saved(run)  # what the section reports for this model
    assert section_saved == n


@pytest.mark.parametrize(("name", "recipe"), _RECIPES, ids=[n for n, _ in _RECIPES])
def test_recipe_check_passes_and_fails_when_the_layer_skips_the_recipe(name, recipe,
                                                                        monkeypatch):
    result = checks.recipe_check(recipe)
    assert result["passed"] and result["max_error"] <= 1.0, result
    monkeypatch.setattr(nt.QuantLinear, "forward", _plain_linear)
    broken = checks.recipe_check(recipe)
    assert not broken["passed"] and broken["max_error"] > 1.0 and not broken["bit_identical"]


def test_torchao_check_fails_for_a_converter_that_does_not_quantise():
    result = checks.torchao_check(lambda model: model)  # a plain float32 Linear
    assert not result["passed"] and result["max_error"] > 1.0


def test_torchao_row_says_not_installed_without_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    assert tm.torchao_convert() == "not installed"


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
def test_torchao_float8_emulation_follows_its_definition():
    converter = tm.torchao_convert()
    assert callable(converter), converter
    result = checks.torchao_check(converter)
    assert result["passed"], result


def test_quick_section_checks_times_and_measures_every_recipe():
    section = tr.training_section(quick=True, rounds=1)
    rows = {r["recipe"]: r for r in section["rows"]}
    assert list(rows) == ["unconverted", *tm.recipes(),
                          *[f"{name} + checkpoint" for name in tr.CHECKPOINTED], tr.TORCHAO]
    assert section["ok"] is True
    assert rows["unconverted"]["saved_bf16_ratio"] == 1.0
    assert rows["unconverted"]["saved_linear_ratio"] == 1.0
    assert rows["unconverted"]["token_linear_ratio"] == rows["unconverted"]["token_ratio"] == 1
    assert section["info"]["plain_fp32_over_bf16"] > 0
    for name in tm.recipes():
        row = rows[name]
        assert row["check"]["passed"]
        for dtype in tr.DTYPES:
            assert row[f"{dtype}_ratio"] > 0 and row[f"{dtype}_step_s"] > 0
            assert row[f"saved_{dtype}_bytes"] > 0
        # the linear layers' part is less than the whole model's, and shrinks with codes
        assert 0 < row["saved_linear_bytes"] < row["saved_bf16_bytes"]
        wgrad_x = tm.recipes()[name].quantizer("x", 0)
        if type(wgrad_x).__name__ == "IdentityQuantizer":  # x kept as it is, in bfloat16
            assert row["saved_linear_ratio"] == 1.0
        elif name != "Bf16":
            assert row["saved_linear_ratio"] < row["saved_bf16_ratio"] < 1.0
            assert 0 < row["token_linear_ratio"] < row["token_ratio"] < 1.0
    for name in tr.CHECKPOINTED:  # checked, and saving less than without checkpointing
        row = rows[f"{name} + checkpoint"]
        assert row["check"]["passed"] and row["fp32_ratio"] > 0
        assert row["saved_bf16_bytes"] < rows[name]["saved_bf16_bytes"]
    torchao = rows[tr.TORCHAO]
    if importlib.util.find_spec("torchao") is None:
        assert torchao["status"] == "not installed"
    text = tr.format_training(section)
    assert "correctness: ok" in text and "NVFP4" in text and tr.TORCHAO in text
    assert "L = plain fp32 step / plain bf16 step" in text and "per token" in text
    assert torch.get_num_threads() >= 1  # the quick run restored torch's thread count


def test_the_bench_fails_when_a_training_check_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tm, "recipes", lambda: {"Bf16": nt.Bf16Recipe()})
    monkeypatch.setattr(tr, "recipes", tm.recipes)
    monkeypatch.setattr(tr, "torchao_convert", lambda: "not installed")
    monkeypatch.setattr(nt.QuantLinear, "forward", _plain_linear)
    path = tmp_path / "bench.json"
    assert command.main(["--quick", "--only", "training", "--rounds", "1", "--json",
                         str(path)]) == 1
    out = capsys.readouterr().out
    assert "correctness: FAILED" in out and "FAILED (" in out
    report = json.loads(path.read_text())
    assert report["correct"] is False and report["training"]["ok"] is False
