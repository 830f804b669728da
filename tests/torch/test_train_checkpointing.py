"""Activation checkpointing leaves training bit-identical: losses, gradients, weights and the
recipe state, for every recipe, with `torch.utils.checkpoint` reentrant and not.

The reference is the same model trained without checkpointing, from the same parameters and
the same inputs; every comparison is exact (tolerance 0): the recomputed forward runs the same
float32 operations on the same bits, so any difference means it used other scales, recorded
its amaxes again or advanced a counter. The issue's own case is checked by hand: five
steps of delayed scaling fill five history slots (the amaxes of four rolled steps and the
fifth step's, still in slot 0), not ten.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint  # noqa: E402

from normlab.torch import QuantLinear, convert, training_step  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Fp8DelayedRecipe,
)
from normlab.torch.training.recompute import recomputing  # noqa: E402
from recipe_table import TRAINING, VARIANTS  # noqa: E402

RECIPES = {**TRAINING, "delayed_unfused": VARIANTS["delayed_unfused"]}
MODES = ["non-reentrant", "reentrant"]


class Net(torch.nn.Module):
    """An input layer, a block that may be checkpointed (two layers, one called twice when
    `shared`), and a head."""

    def __init__(self, ckpt: str | None, shared: bool = False) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64)
        self.head = torch.nn.Linear(64, 8)
        self.ckpt, self.shared = ckpt, shared

    def block(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        if self.shared:  # the same layers again: one step, two uses
            h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.inp(x))
        if self.ckpt is None:
            h = self.block(h)
        else:
            h = checkpoint(self.block, h, use_reentrant=self.ckpt == "reentrant")
        return self.head(h)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(48, 32, generator=g) * (1.0 + step)  # amaxes change from step to step
    return x, torch.randn(48, 8, generator=g)


def _run(recipe: object, ckpt: str | None, steps: int = 4, shared: bool = False,
         micro: int = 1) -> dict[str, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = convert(Net(ckpt, shared), recipe, keep_lm_head=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen: dict[str, list[torch.Tensor]] = {"loss": [], "grad": [], "state": []}
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        with training_step(model):
            for xs, ys in zip(x.chunk(micro), y.chunk(micro), strict=True):
                loss = torch.nn.functional.mse_loss(model(xs), ys) / micro
                loss.backward()
                seen["loss"].append(loss.detach())
        seen["grad"] += [p.grad.clone() for p in model.parameters()]
        opt.step()
    seen["state"] = list(model.state_dict().values())
    return seen


def _assert_identical(a: dict, b: dict) -> None:
    for key in a:
        assert len(a[key]) == len(b[key])
        for i, (u, v) in enumerate(zip(a[key], b[key], strict=True)):
            assert torch.equal(u, v), f"{key} {i}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_checkpointing_is_bit_identical(name: str, mode: str) -> None:
    _assert_identical(_run(RECIPES[name], None), _run(RECIPES[name], mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["delayed", "nvfp4"])
def test_checkpointing_with_accumulation_and_a_shared_block(name: str, mode: str) -> None:
    # two micro-batches per step and a block called twice: one step of several forwards,
    # every recomputation inside it
    plain = _run(RECIPES[name], None, steps=3, shared=True, micro=2)
    _assert_identical(plain, _run(RECIPES[name], mode, steps=3, shared=True, micro=2))


def test_five_steps_fill_five_history_slots_not_ten() -> None:
    # the case: the recomputed forward rolled the history a second time per step
    recipe = Fp8DelayedRecipe(amax_history_len=16)
    for ckpt in (None, "non-reentrant", "reentrant"):
        torch.manual_seed(0)
        model = convert(Net(ckpt), recipe, keep_lm_head=False)
        for step in range(5):
            x, y = _batch(step)
            torch.nn.functional.mse_loss(model(x), y).backward()
        filled = (model.up.amax_history != 0).sum(dim=1)  # per operand x, W, dy
        assert filled.tolist() == [5, 5, 5], (ckpt, filled.tolist())


def test_recomputing_is_true_only_inside_the_backward_pass() -> None:
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            seen.append(recomputing())
            return h * h  # saves h: the backward needs the recomputation

    x = torch.ones(3, requires_grad=True)
    for reentrant in (False, True):
        seen.clear()
        checkpoint(Probe(), x, use_reentrant=reentrant).sum().backward()
        assert seen == [False, True], (reentrant, seen)
    assert not recomputing()


def test_a_quantlinear_recomputed_in_eval_mode_or_switched_off_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from normlab.torch import no_quantization
    from normlab.torch.training import training_mode

    layer = QuantLinear(16, 16, recipe=Fp8DelayedRecipe(amax_history_len=4))
    x = torch.randn(4, 16, requires_grad=True)
    layer(x).sum().backward()
    before = layer.get_extra_state()
    layer.eval()
    monkeypatch.setattr(training_mode, "_warned", False)  # the warning comes once a process
    with pytest.warns(training_mode.EvalModeTrainingWarning, match="model.train"):
        checkpoint(layer, x, use_reentrant=False).sum().backward()
    layer.train()
    with no_quantization():
        checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert torch.equal(layer.get_extra_state(), before)


# torch-side warnings while dynamo traces: it instantiates the autograd.Function, and reads
# `.grad` of the non-leaf activation it wraps where the checkpointed block breaks the graph
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_a_compiled_model_with_checkpointing_and_training_step_equals_eager() -> None:
    # aot_eager runs the traced float32 operations as eager does (tolerance 0); the
    # checkpointed block, whose recipe state changes, runs outside the traced graph
    import torch._dynamo as dynamo

    def run(ckpt: str | None, compiled: bool) -> dict:
        dynamo.reset()
        torch.manual_seed(0)
        model = convert(Net(ckpt), RECIPES["delayed"], keep_lm_head=False)
        call = torch.compile(model, backend="aot_eager") if compiled else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        seen: dict[str, list[torch.Tensor]] = {"loss": []}
        for step in range(3):
            x, y = _batch(step)
            with training_step(call):  # the compiled wrapper holds the converted layers
                for xs, ys in zip(x.chunk(2), y.chunk(2), strict=True):
                    loss = torch.nn.functional.mse_loss(call(xs), ys) / 2
                    loss.backward()
                    seen["loss"].append(loss.detach())
            opt.step()
            opt.zero_grad()
        seen["state"] = list(model.state_dict().values())
        return seen

    _assert_identical(run(None, False), run("non-reentrant", True))
