"""convert / unconvert: which layers are converted, the per-layer choice, re-conversion, the
summary, and state dicts that load between converted and plain models.

How `torch.nn.MultiheadAttention` and `torch.nn.TransformerEncoderLayer` use their linear
layers is observed at run time (a forward hook; outputs against the unconverted layer), so a
torch release that changes it fails here instead of leaving the summary wrong. Values compared
between a converted and a plain model are compared exactly: the same parameters pass through
the same operations.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from normlab.torch import QuantLinear, convert, unconvert  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)

NDQ = torch.nn.modules.linear.NonDynamicallyQuantizableLinear


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.mid = NDQ(32, 32)
        self.lm_head = torch.nn.Linear(32, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.relu(self.mid(torch.relu(self.up(x)))))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))


def test_linear_subclasses_are_converted_and_unconverted_back() -> None:
    net = _net()
    params = list(net.parameters())
    plain_keys = {k: v.shape for k, v in net.state_dict().items()}
    net, summary = convert(net, Bf16Recipe(), return_summary=True)
    assert isinstance(net.mid, QuantLinear) and isinstance(net.up, QuantLinear)
    assert summary.converted == ("up", "mid", "lm_head")
    assert all(a is b for a, b in zip(net.parameters(), params, strict=True))
    unconvert(net)
    assert type(net.mid) is NDQ and type(net.up) is torch.nn.Linear
    assert all(a is b for a, b in zip(net.parameters(), params, strict=True))
    assert {k: v.shape for k, v in net.state_dict().items()} == plain_keys


def test_multihead_attention_never_calls_out_proj_so_it_is_left_alone(caplog) -> None:
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    calls = []
    mha.out_proj.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 5, 16)
    mha(x, x, x)  # training mode, autograd on: the ordinary path
    assert calls == []  # torch computes out_proj from out_proj.weight directly
    model = torch.nn.Sequential(mha)
    with caplog.at_level(logging.INFO, logger="normlab.torch.training.convert"):
        model, summary = convert(model, Fp8CurrentRecipe(), return_summary=True)
    assert type(mha.out_proj) is NDQ
    assert "MultiheadAttention" in summary.left_alone["0.out_proj"]
    assert any(r.levelno == logging.WARNING and "0.out_proj" in r.getMessage()
               for r in caplog.records)


def test_encoder_layer_fast_path_bypasses_converted_layers_as_the_note_says() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    plain = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    plain.load_state_dict(layer.state_dict())
    model, summary = convert(torch.nn.Sequential(layer), MXRecipe(), return_summary=True)
    assert "fast path" in next(d.reason for d in summary.layers if d.name == "0.linear1")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert torch.equal(model(x), plain(x))  # the fused path ran, not QuantLinear
    with torch.enable_grad():
        assert not torch.equal(model(x), plain(x))  # autograd on: QuantLinear runs


def test_a_layer_shared_by_two_parents_is_replaced_in_both() -> None:
    shared = torch.nn.Linear(8, 8)
    model = torch.nn.ModuleDict({"a": torch.nn.Sequential(shared),
                                 "b": torch.nn.Sequential(shared)})
    model, summary = convert(model, Bf16Recipe(), return_summary=True)
    assert summary.converted == ("a.0",)  # named_modules lists a shared module once
    assert model["a"][0] is model["b"][0] and isinstance(model["b"][0], QuantLinear)
    unconvert(model)
    assert model["a"][0] is model["b"][0] and type(model["b"][0]) is torch.nn.Linear


def test_overridden_forward_and_lazy_layers_are_left_alone_with_the_reason() -> None:
    class Scaled(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2.0 * super().forward(x)

    model = torch.nn.Sequential(Scaled(4, 4), torch.nn.LazyLinear(4))
    model, summary = convert(model, Bf16Recipe(), return_summary=True)
    assert type(model[0]) is Scaled and "overrides forward" in summary.left_alone["0"]
    assert "lazy" in summary.left_alone["1"]


def test_module_filter_fn_and_the_deprecated_skip() -> None:
    seen = []

    def keep_up(module: torch.nn.Module, fqn: str) -> bool:
        seen.append((type(module).__name__, fqn))
        return fqn == "up"

    net, summary = convert(_net(), Bf16Recipe(), module_filter_fn=keep_up, return_summary=True)
    assert seen == [("Linear", "up"), ("NonDynamicallyQuantizableLinear", "mid"),
                    ("Linear", "lm_head")]
    assert summary.converted == ("up",)
    assert summary.left_alone["mid"] == "module_filter_fn returned False"
    with pytest.warns(DeprecationWarning, match="module_filter_fn"):
        net = convert(_net(), Bf16Recipe(), skip=lambda fqn, m: fqn == "mid")
    assert isinstance(net.up, QuantLinear) and type(net.mid) is NDQ


def test_recipe_mapping_first_match_wins_and_none_leaves_alone() -> None:
    mx, nv = MXRecipe(), NVFP4Recipe()
    net, summary = convert(_net(), {"mid": None, "u*": nv, "*": mx}, keep_lm_head=False,
                           return_summary=True)
    assert net.up.recipe == nv and net.lm_head.recipe == mx and type(net.mid) is NDQ
    assert "'mid'" in summary.left_alone["mid"]
    net, summary = convert(_net(), {"up": mx}, return_summary=True)
    assert "no pattern" in summary.left_alone["mid"]


def test_lm_head_stays_high_precision_by_default_and_visibly() -> None:
    net, summary = convert(_net(), Fp8DelayedRecipe(), return_summary=True)
    assert type(net.lm_head) is torch.nn.Linear
    assert "LM head" in summary.left_alone["lm_head"] and "lm_head" in str(summary)
    assert isinstance(convert(_net(), Bf16Recipe()).lm_head, QuantLinear)  # the baseline
    net = convert(_net(), Fp8DelayedRecipe(), keep_lm_head=False)
    assert isinstance(net.lm_head, QuantLinear)


def test_reconverting_applies_the_new_recipe() -> None:
    net = convert(_net(), Fp8DelayedRecipe(amax_history_len=4))
    net(_x()).sum().backward()
    history = net.up.amax_history.clone()
    net, summary = convert(net, Fp8DelayedRecipe(amax_history_len=4), return_summary=True)
    assert {d.action for d in summary.layers if d.name != "lm_head"} == {"unchanged"}
    assert torch.equal(net.up.amax_history, history)  # same recipe: state kept
    params = list(net.parameters())
    net, summary = convert(net, MXRecipe(), return_summary=True)
    assert net.up.recipe == MXRecipe() and net.mid.recipe == MXRecipe()
    assert {d.action for d in summary.layers if d.name != "lm_head"} == {"reconvert"}
    assert all(a is b for a, b in zip(net.parameters(), params, strict=True))
    assert type(unconvert(net).mid) is NDQ  # the original class survives re-conversion


def test_summary_is_logged(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="normlab.torch.training.convert"):
        convert(_net(), MXRecipe())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "2 converted" in text and "lm_head" in text


def test_state_dicts_load_between_converted_and_plain_models() -> None:
    net = convert(_net(), Fp8DelayedRecipe(amax_history_len=4), keep_lm_head=False)
    net(_x()).sum().backward()
    state = net.state_dict()
    plain = Net()
    result = plain.load_state_dict(state, strict=False)
    assert result.missing_keys == []
    assert sorted(result.unexpected_keys) == ["lm_head._extra_state", "mid._extra_state",
                                              "up._extra_state"]
    for key, value in plain.state_dict().items():
        assert torch.equal(value, state[key])
    # the way back in full: unconvert gives the plain model's keys, strictly loadable
    plain.load_state_dict(unconvert(convert(_net(), MXRecipe())).state_dict())
    # a plain checkpoint loads strictly into a converted model; its recipe state is kept
    other = convert(_net(), Fp8DelayedRecipe(amax_history_len=4), keep_lm_head=False)
    other(_x(1)).sum().backward()
    before = other.up.get_extra_state()
    other.load_state_dict(_net().state_dict())
    assert torch.equal(other.up.get_extra_state(), before)
    assert torch.equal(other.up.weight, _net().up.weight)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="itself a Linear"):
        convert(torch.nn.Linear(2, 2), Bf16Recipe())
    with pytest.raises(TypeError, match="recipe must be one of"):
        convert(_net(), {"*": "fp8"})
    with pytest.raises(TypeError, match="name patterns"):
        convert(_net(), {3: Bf16Recipe()})
    with pytest.raises(TypeError, match="module_filter_fn"):
        convert(_net(), Bf16Recipe(), module_filter_fn=True)
    with pytest.raises(TypeError, match="keep_lm_head"):
        convert(_net(), Bf16Recipe(), keep_lm_head="yes")
    with pytest.raises(TypeError, match="itself a"):
        unconvert(QuantLinear(2, 2, recipe=Bf16Recipe()))


def test_a_mapping_pattern_that_matches_no_layer_warns_or_raises() -> None:
    from normlab.torch import Fp8CurrentRecipe, UnmatchedPatternWarning

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))

    mapping = {"*.mpl.*": Fp8CurrentRecipe(), "1": Fp8CurrentRecipe()}  # a misspelt pattern
    with pytest.warns(UnmatchedPatternWarning, match=r"\*\.mpl\.\*"):
        model = convert(net(), mapping)
    assert type(model[1]).__name__ == "QuantLinear"  # the matching pattern still converts
    plain = net()
    with pytest.raises(ValueError, match=r"\*\.mpl\.\*.*match no linear layer"):
        convert(plain, mapping, strict=True)
    assert type(plain[1]) is torch.nn.Linear  # nothing converted before the error
    convert(net(), {"*": Fp8CurrentRecipe()}, strict=True)  # every pattern matches: silent
    with pytest.raises(TypeError, match="strict must be a bool"):
        convert(net(), mapping, strict="yes")  # type: ignore[call-overload]
