"""`normlab.torch.inspect` as a user drives it: shadow mode changes nothing, `every`,
`modules`, the JSON-lines file, NaN and inf counted, bad input rejected.

Bit-identity is exact (`torch.equal` on every loss and parameter): the hooks only read
tensors, so any difference at all is a bug. The model has dropout, so a hook that drew
from PyTorch's generator would change the masks and fail the test.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import normlab.torch as nt

ALL = [nt.Bf16Recipe(), nt.Fp8DelayedRecipe(amax_history_len=4), nt.Fp8CurrentRecipe(),
       nt.MXRecipe(), nt.NVFP4Recipe(), nt.BlockwiseFp8Recipe(block_size=16)]


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.2),
        torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def _train(net: torch.nn.Module, steps: int, log=None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(24, 32, generator=g), torch.randn(24, 4, generator=g)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if log is not None:
            log.step()
    return losses


@pytest.mark.parametrize("every", [1, 3])
def test_shadow_mode_leaves_losses_and_parameters_bit_identical(every):
    plain = _net()
    want = _train(plain, 4)
    watched = _net()
    with nt.inspect(watched, ALL, every=every) as log:
        got = _train(watched, 4, log)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    for (name, p), q in zip(watched.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q), name
    # and it did record: the recorded steps x 3 layers x 3 tensors x 6 recipes
    recorded = len(range(0, 4, every))
    assert len(log.records) == recorded * 3 * 3 * len(ALL)
    assert not any(m._forward_hooks for m in watched.modules())  # hooks removed on exit


def test_every_records_every_nth_step_and_modules_selects_layers(tmp_path):
    net = _net()
    path = tmp_path / "log.jsonl"
    with nt.inspect(net, nt.MXRecipe(), every=3, modules=["0", "5"], path=path) as log:
        _train(net, 7, log)
    assert sorted({r["step"] for r in log.records}) == [0, 3, 6]
    assert {r["module"] for r in log.records} == {"0", "5"}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == log.records


def test_hooks_are_installed_for_recorded_steps_only():
    """With every=3, steps 1, 2, 4 and 5 run without any hook of the inspector's: no
    forward hook on a layer, no gradient hook on a layer's output (hooks left installed
    that return early would fail this), and the layers are left as they were on exit."""
    net = _net()
    layers = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    outputs: list[torch.Tensor] = []
    for m in layers:  # the user's own hook, which must stay
        m.register_forward_hook(lambda module, args, out: outputs.append(out))
    before = [len(m._forward_hooks) for m in layers]
    seen = []
    x = torch.randn(8, 32)
    with nt.inspect(net, nt.NVFP4Recipe(), every=3) as log:
        for step in range(7):
            outputs.clear()
            added = [len(m._forward_hooks) - b for m, b in zip(layers, before, strict=True)]
            net(x).sum().backward()
            seen.append((step, added, [o._backward_hooks is not None for o in outputs]))
            log.step()
    for step, added, grad_hooked in seen:
        recorded = step % 3 == 0
        assert added == [int(recorded)] * len(layers), step
        assert grad_hooked == [recorded] * len(layers), step
    assert [len(m._forward_hooks) for m in layers] == before
    assert sorted({r["step"] for r in log.records}) == [0, 3, 6]
    log.step()  # after the context: installs nothing
    assert [len(m._forward_hooks) for m in layers] == before


def test_modules_as_a_predicate_and_patterns():
    net = torch.nn.ModuleDict({"attn": torch.nn.Linear(8, 8), "mlp": torch.nn.Linear(8, 8)})
    x = torch.randn(2, 8)

    def run(modules):
        with nt.inspect(net, nt.Fp8CurrentRecipe(), modules=modules) as log:
            (net["attn"](x) + net["mlp"](x)).sum().backward()
            log.step()
        return {r["module"] for r in log.records}

    assert run(lambda m, name: name.startswith("m")) == {"mlp"}
    assert run("a*") == {"attn"}
    assert run(None) == {"attn", "mlp"}


def test_file_is_flushed_after_each_recorded_step(tmp_path):
    net, path = _net(), tmp_path / "log.jsonl"
    with nt.inspect(net, nt.NVFP4Recipe(), path=path) as log:
        _train(net, 1, log)
        first = path.read_text().splitlines()  # still inside: the step is on disk
        assert len(first) == 9
        _train(net, 1, log)
        assert len(path.read_text().splitlines()) == 18


def test_nan_and_inf_are_counted_not_raised():
    layer = torch.nn.Sequential(torch.nn.Linear(16, 4))
    x = torch.randn(8, 16)
    x[0, 0], x[1, 1] = math.nan, math.inf
    with nt.inspect(layer, [nt.Fp8CurrentRecipe(), nt.MXRecipe()]) as log:
        layer(x).sum().backward()
        log.step()
    inputs = [r for r in log.records if r["tensor"] == "input"]
    assert [r["nonfinite"] for r in inputs] == [2 / 128, 2 / 128]
    assert all(math.isfinite(r["amax"]) for r in inputs)


def test_a_step_left_open_is_finished_on_exit():
    net = _net()
    with nt.inspect(net, nt.MXRecipe()) as log:
        net(torch.randn(2, 32)).sum().backward()  # no log.step()
    assert {r["step"] for r in log.records} == {0} and len(log.records) == 9


def test_hf_conv1d_weight_is_read_in_the_gemm_layout():
    transformers = pytest.importorskip("transformers")
    conv = transformers.pytorch_utils.Conv1D(8, 16)  # nf=8, nx=16: weight (16, 8)
    net = torch.nn.Sequential(conv)
    with nt.inspect(net, nt.NVFP4Recipe()) as log:
        net(torch.randn(4, 16)).sum().backward()
        log.step()
    weight = next(r for r in log.records if r["tensor"] == "weight")
    expect = nt.nvfp4_quantize(conv.weight.detach().t(), axis=1, block_shape=(16, 16))
    assert weight["scale_max"] == float((expect.block_scales * expect.tensor_scale).max())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"every": 0}, ValueError, "every must be >= 1; got 0"),
    ({"every": 1.5}, TypeError, "every must be an integer"),
    ({"modules": ["nope"]}, ValueError, r"modules \['nope'\] match no"),
    ({"modules": [3]}, TypeError, "modules must be"),
    ({"modules": 3}, TypeError, "modules must be None"),
    ({"path": 3}, TypeError, "path must be"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match), nt.inspect(_net(), nt.MXRecipe(), **kwargs):
        pass


@pytest.mark.parametrize("recipe, error, match", [
    ("nvfp4", TypeError, "recipe must be a training recipe .* got 'nvfp4'"),
    ([nt.MXRecipe(), object()], TypeError, "recipe must be a training recipe"),
    ([], ValueError, "non-empty list"),
    ([nt.MXRecipe(), nt.MXRecipe()], ValueError, "same recipe twice"),
])
def test_unknown_recipe(recipe, error, match):
    with pytest.raises(error, match=match), nt.inspect(_net(), recipe):
        pass


def test_not_a_module_and_no_converted_layer():
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module; got list"), \
            nt.inspect([torch.nn.Linear(2, 2)], nt.MXRecipe()):
        pass
    with pytest.raises(ValueError, match="no converted"), nt.inspect(_net(), None):
        pass
