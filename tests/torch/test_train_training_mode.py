"""Training in `eval()` mode warns once; training mode is what records and updates.

A converted model trained in `eval()` mode (what Hugging Face `from_pretrained` returns)
keeps its delayed scales frozen: the rule is `module.training` (see
`normlab.torch.training.training_mode`), so the first forward in eval mode that records for a
backward warns once, with `EvalModeTrainingWarning`. After `model.train()` the scales
update. An evaluation (eval mode, autograd off) warns about nothing (the suite turns
warnings into errors) and changes nothing. Expected scales come from the recorded amaxes
through the shared delayed update, restated here as the plain formula
`fp8_max / amax` (margin 0, power of two not asked for).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from normlab.torch import (  # noqa: E402
    EvalModeTrainingWarning,
    Fp8DelayedRecipe,
    MXRecipe,
    convert,
)
from normlab.torch.training import training_mode  # noqa: E402


def _model(recipe: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return convert(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 4)), recipe)


def _step(model: torch.nn.Module, i: int) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
    model(x).square().mean().backward()


def test_training_in_eval_mode_warns_once_and_keeps_the_scales(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_mode, "_warned", False)
    model = _model(Fp8DelayedRecipe(amax_history_len=4)).eval()  # as from_pretrained
    with pytest.warns(EvalModeTrainingWarning, match=r"model\.train\(\)") as seen:
        for i in range(3):
            _step(model, i)
    assert len([w for w in seen if w.category is EvalModeTrainingWarning]) == 1
    assert torch.equal(model[0].scale, torch.ones(3))  # frozen at the initial scales
    assert torch.equal(model[0].amax_history, torch.zeros(3, 4))
    model.train()  # the fix the warning names
    for i in range(2):
        _step(model, i)
    amax_x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)).abs().max()
    assert model[0].scale[0] == torch.tensor(448.0) / amax_x  # E4M3's max over amax(x)


def test_evaluation_in_eval_mode_neither_warns_nor_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_mode, "_warned", False)
    model = _model(Fp8DelayedRecipe(amax_history_len=4))
    _step(model, 0)
    before = [m.get_extra_state() for m in model if hasattr(m, "amax_history")]
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 16))
    after = [m.get_extra_state() for m in model if hasattr(m, "amax_history")]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not training_mode._warned


def test_recipes_without_state_do_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_mode, "_warned", False)
    model = _model(MXRecipe()).eval()
    _step(model, 0)  # MX has no scale state and no collective: eval-mode training is fine
    assert not training_mode._warned


def test_a_resumed_run_continues_bit_for_bit_after_train(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the resume how-to of docs/torch.md: the reloaded model comes back in eval() mode
    # (as from_pretrained returns it); after model.train() it continues as the original
    monkeypatch.setattr(training_mode, "_warned", False)
    recipe = Fp8DelayedRecipe(amax_history_len=4)
    original = _model(recipe)
    for i in range(2):
        _step(original, i)
    saved = {k: v.clone() for k, v in original.state_dict().items()}

    def resumed(train: bool) -> torch.nn.Module:
        model = _model(recipe)
        model.load_state_dict(saved)
        model.eval()  # what from_pretrained returns
        if train:
            model.train()  # the how-to's line
        return model

    good, frozen = resumed(True), resumed(False)
    for model in (original, good):
        _step(model, 2)
    with pytest.warns(EvalModeTrainingWarning):
        _step(frozen, 2)
    for i in range(3, 5):
        for model in (original, good, frozen):
            _step(model, i)
    want = original.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in good.state_dict().items())
    assert not torch.equal(frozen[0].scale, original[0].scale)  # eval mode froze them
