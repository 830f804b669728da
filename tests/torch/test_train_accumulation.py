"""Delayed scaling over micro-batches: Transformer Engine's scale sequence, and one update per
optimizer step with `training_step`.

Expected sequences are derived independently of `QuantLinear`'s step logic: by hand for
power-of-two amaxes (E4M3's max 448 over an amax is exact), and by replaying Transformer
Engine's rule with `normlab.precision.Fp8Meta` (the recipe arithmetic the differential suite
checks against TE's kernels): `quantize` records an amax into history slot 0, `update` is the
reduction-free `reduce_and_update` of one module. TE updates the forward tensors' metas when
an `autocast` region exits and the backward tensors' at the end of the backward pass, and its
examples open one region per micro-batch forward; normlab's default is that rule. With
`training_step` the step is one region for every operand (scales fixed over the step, amaxes
recorded as a running max, one roll), which must also equal one batch holding all the
micro-batches' rows. Comparisons are exact: the same float32 values through the same
update arithmetic.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import DelayedScaling, Fp8Meta  # noqa: E402
from normlab.torch import (  # noqa: E402
    QuantLinear,
    no_quantization,
    training_step,
)
from normlab.torch.recipes import Fp8CurrentRecipe, Fp8DelayedRecipe  # noqa: E402

K, N, L = 16, 8, 4  # in, out features; history length (short: the window wraps)
RECIPE = Fp8DelayedRecipe(amax_history_len=L, margin=1)
STEPS, MICRO = 3, 3


def _layer() -> QuantLinear:
    torch.manual_seed(0)
    return QuantLinear(K, N, recipe=RECIPE)


def _data(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (4, K) and the output gradient dy (4, N) of one micro-batch: amaxes vary."""
    g = torch.Generator().manual_seed(10 * step + micro)
    x = torch.randn(4, K, generator=g) * (1.0 + micro) * 2.0**step
    return x, torch.randn(4, N, generator=g) * 1e-2 * (MICRO - micro)


def _reweigh(layer: QuantLinear, step: int) -> None:
    """Stand-in for the optimizer step: the weight (and its amax) changes between steps."""
    with torch.no_grad():
        layer.weight.mul_(1.0 + 0.5 * step)


def _micro_batch(layer: QuantLinear, x: torch.Tensor, dy: torch.Tensor) -> tuple:
    layer(x).backward(dy)
    return layer.scale.clone(), layer.amax_history.clone()  # used scales, recorded history


def _run(layer: QuantLinear, *, region: bool) -> list[tuple]:
    """(scale, history) after each micro-batch's backward, over STEPS x MICRO."""
    seen = []
    for step in range(STEPS):
        _reweigh(layer, step)
        if region:
            with training_step(layer):
                seen += [_micro_batch(layer, *_data(step, i)) for i in range(MICRO)]
        else:
            seen += [_micro_batch(layer, *_data(step, i)) for i in range(MICRO)]
    return seen


def _te_replay(*, region: bool) -> list[tuple]:
    """The same sequence from Fp8Meta calls: per micro-batch (TE's one autocast region per
    micro-batch forward, backward after it) or per step (`training_step`)."""
    layer = _layer()  # only for the weights, which the replay reads, never the state
    rule = DelayedScaling(margin=RECIPE.margin, amax_history_len=L)
    metas = [Fp8Meta(rule, "forward"), Fp8Meta(rule, "forward"), Fp8Meta(rule, "backward")]
    seen = []
    for step in range(STEPS):
        _reweigh(layer, step)
        w = layer.weight.detach().numpy()
        for i in range(MICRO):
            x, dy = _data(step, i)
            for meta, t in zip(metas, (x.numpy(), w, dy.numpy()), strict=True):
                meta.quantize(t)  # records amax(t) into slot 0
            seen.append((np.array([m.scale for m in metas], np.float32),
                         np.stack([m.amax_history for m in metas])))
            if not region:  # autocast exit (x, W), then the end of the backward (dy)
                for meta in metas:
                    meta.update()
        if region:
            for meta in metas:
                meta.update()
    return seen


def _assert_same(got: list[tuple], want: list[tuple]) -> None:
    assert len(got) == len(want)
    for i, ((s, h), (ws, wh)) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(s.numpy(), ws, err_msg=f"scale after micro-batch {i}")
        np.testing.assert_array_equal(h.numpy(), wh, err_msg=f"history after micro-batch {i}")


def test_without_training_step_every_micro_batch_is_a_te_autocast_region() -> None:
    _assert_same(_run(_layer(), region=False), _te_replay(region=False))


def test_training_step_updates_once_per_step() -> None:
    _assert_same(_run(_layer(), region=True), _te_replay(region=True))


def test_the_x_scale_by_hand() -> None:
    # E4M3, margin 0: scale = 448 / amax. Two micro-batches with x amaxes 2 then 8.
    def scales_used(region: bool) -> list[float]:
        layer = QuantLinear(2, 1, recipe=Fp8DelayedRecipe(amax_history_len=4))
        used = []
        for _ in range(2):
            with training_step(layer) if region else contextlib.nullcontext():
                for a in (2.0, 8.0):
                    layer(torch.tensor([[a, 0.0]])).sum().backward()
                    used.append(float(layer.scale[0]))
        return used

    # per micro-batch: 1 (fresh), 448/2, then max(2, 8) = 8 in the window: 56, 56
    assert scales_used(region=False) == [1.0, 224.0, 56.0, 56.0]
    # per step: the first step's two micro-batches use 1; the step's amax is 8
    assert scales_used(region=True) == [1.0, 1.0, 56.0, 56.0]


def test_micro_batches_in_one_step_equal_one_batch_of_all_their_rows() -> None:
    # the amax of the step is the max over its micro-batches: the amax of the whole batch
    split, whole = _layer(), _layer()
    for step in range(STEPS):
        _reweigh(split, step)
        _reweigh(whole, step)
        parts = [_data(step, i) for i in range(MICRO)]
        with training_step(split):
            for x, dy in parts:
                got = _micro_batch(split, x, dy)
        want = _micro_batch(whole, torch.cat([x for x, _ in parts]),
                            torch.cat([dy for _, dy in parts]))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), step


def test_evaluation_and_the_off_switch_inside_a_step_change_nothing() -> None:
    plain, mixed = _layer(), _layer()
    for step in range(STEPS):
        _reweigh(plain, step)
        _reweigh(mixed, step)
        with training_step(plain):
            want = [_micro_batch(plain, *_data(step, i)) for i in range(MICRO)]
        with training_step(mixed):
            got = []
            for i in range(MICRO):
                mixed.eval()
                with torch.no_grad():
                    mixed(_data(step, 7)[0])  # evaluation between micro-batches
                mixed.train()
                with no_quantization():  # a high-precision micro-batch records nothing
                    x, dy = _data(step, 8)
                    mixed(x).backward(dy)
                got.append(_micro_batch(mixed, *_data(step, i)))
        for (a, b), (c, d) in zip(got, want, strict=True):
            assert torch.equal(a, c) and torch.equal(b, d), step


def test_regions_nest_and_a_plain_forward_after_a_region_updates_once() -> None:
    nested, flat = _layer(), _layer()
    with training_step(nested), training_step(nested):
        a = [_micro_batch(nested, *_data(0, i)) for i in range(MICRO)]
    with training_step(flat):
        b = [_micro_batch(flat, *_data(0, i)) for i in range(MICRO)]
    for (s, h), (t, g) in zip(a, b, strict=True):
        assert torch.equal(s, t) and torch.equal(h, g)
    _micro_batch(nested, *_data(1, 0))  # the next step: one update, then this record
    assert int((nested.amax_history[0] != 0).sum()) == 2  # the region's amax rolled + the new


def test_training_step_leaves_other_recipes_and_bad_arguments() -> None:
    layer = QuantLinear(K, N, recipe=Fp8CurrentRecipe())
    x, dy = _data(0, 0)
    with training_step(layer):
        layer(x).backward(dy)
    assert layer.amax_history is None
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        with training_step("model"):  # type: ignore[arg-type]
            pass
