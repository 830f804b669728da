"""Data-parallel training with QuantLinear under DDP and FSDP2: what the amax reduction makes
equal across ranks, and what it does not.

Two gloo processes on CPU (torch.multiprocessing, spawn), run by a script in a subprocess
with a timeout so that a hung collective can never hang the suite. Each rank trains a small
MLP whose Linear layers are QuantLinear (FP8 delayed scaling, FP8 current scaling), wrapped
in DistributedDataParallel or sharded with FSDP2 (`fully_shard` on each layer and the root),
on its half of a batch; a one-process run trains the same model on the whole batch. The local
loss is ``sum over the rank's rows / global batch`` and the learning rate is multiplied by the
world size, so that each rank's dy equals the one-process dy row for row and the averaged
gradient times the learning rate equals the one-process step up to float32 summation order.

A second run uses the usual local *mean* loss (``sum over the rank's rows / local batch``,
learning rate unchanged): each rank's dy is then the world size (2) times the one-process dy,
so the all-reduced dy amax is twice the one-process amax and the dy scale half of it, while
the x and W scales equal the one-process ones. A power-of-two factor leaves the scaled values
and their rounding unchanged, so the trained weights still match the one-process run.

Tolerance: ranks agree exactly (scales, amax histories, weights: the collectives give every
rank the same bits). Against the one-process run: rtol 1e-5 / atol 1e-6. The only difference
is the float32 summation order of dW (two partial sums of 32 rows plus an all-reduce, against
one sum of 64 rows), about 1e-7 relative per step, carried through 5 SGD steps; a rounding
decision of an fp8 element flipped by that difference moves a value by up to an fp8 ulp
(6%), which this tolerance would flag. The control run without amax reduction (each rank
scales by its own half-batch amax) differs from the one-process run by far more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import contextlib, gc, json, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.fsdp import fully_shard
    from normlab.torch import QuantLinear, convert, training_step
    from normlab.torch.training._extra_state import unpack_extra_state
    from normlab.torch.recipes import Fp8CurrentRecipe, Fp8DelayedRecipe

    WORLD, STEPS, LR = 2, 5, 0.05
    RECIPES = {
        "delayed": Fp8DelayedRecipe(amax_history_len=4),
        "current": Fp8CurrentRecipe(),
        "current_unreduced": Fp8CurrentRecipe(reduce_amax=False),
    }

    def data():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 32, generator=g) * torch.linspace(0.2, 3.0, 64)[:, None]
        return x, torch.randn(64, 16, generator=g)

    def model(recipe):
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                  torch.nn.Linear(64, 16))
        return convert(net, recipe)

    def train(net, x, y, lr, batch):
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((net(x) - y) ** 2).sum() / batch
            loss.backward()
            opt.step()
        del opt

    def train_accumulated(ddp, x, y, lr, batch, micro=2):
        # gradient accumulation: each rank's rows in two micro-batches, one scale update per
        # step, gradients all-reduced once (no_sync for the first micro-batch)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        for _ in range(STEPS):
            opt.zero_grad()
            with training_step(ddp):
                for i, (xs, ys) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
                    with ddp.no_sync() if i < micro - 1 else contextlib.nullcontext():
                        (((ddp(xs) - ys) ** 2).sum() / batch).backward()
            opt.step()
        del opt

    def state(net):
        # the end of the last step: reduce and update the delayed scales (a collective)
        for m in net.modules():
            if isinstance(m, QuantLinear):
                m.update_scales()
        out = {}
        for k, v in net.state_dict().items():
            if k.endswith("_extra_state"):
                out.update({k[:-len("_extra_state")] + n: t.tolist()
                            for n, t in unpack_extra_state(v).items()
                            if isinstance(t, torch.Tensor)})
            else:
                full = v.full_tensor() if hasattr(v, "full_tensor") else v  # FSDP2: DTensor
                out[k] = full.tolist()
        return out

    def wrap(net, how):
        if how == "ddp":
            return torch.nn.parallel.DistributedDataParallel(net)
        for m in net:
            if isinstance(m, QuantLinear):
                fully_shard(m)
        return fully_shard(net)

    def worker(rank, path):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + path + ".rdv",
                                rank=rank, world_size=WORLD)
        x, y = data()
        rows = slice(rank * 32, rank * 32 + 32)
        out = {}
        for how in ("ddp", "fsdp2"):
            for name, recipe in RECIPES.items():
                net = model(recipe)
                wrapped = wrap(net, how)
                train(wrapped, x[rows], y[rows], LR * WORLD, 64)
                out[f"{how}-{name}"] = state(net)
                del wrapped, net
            net = model(RECIPES["current"])
            wrapped = wrap(net, how)
            train(wrapped, x[rows], y[rows], LR, 32)  # the local mean loss
            out[f"{how}-mean"] = state(net)
            del wrapped, net
        net = model(RECIPES["delayed"])
        wrapped = wrap(net, "ddp")
        train_accumulated(wrapped, x[rows], y[rows], LR * WORLD, 64)
        out["ddp-accumulated"] = state(net)
        del wrapped, net
        gc.collect()
        dist.destroy_process_group()
        with open(path + f".{rank}.json", "w") as f:
            json.dump(out, f)

    if __name__ == "__main__":
        path = sys.argv[1]
        torch.set_num_threads(1)
        x, y = data()
        single = {}
        for name, recipe in RECIPES.items():
            net = model(recipe)
            train(net, x, y, LR, 64)
            single[name] = state(net)
        with open(path + ".single.json", "w") as f:
            json.dump(single, f)
        mp.spawn(worker, args=(path,), nprocs=WORLD, join=True)
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("ddp")
    script = tmp / "ddp_train.py"
    script.write_text(SCRIPT)
    base = str(tmp / "run")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script), base], env=env, timeout=240,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: json.loads(Path(f"{base}.{k}.json").read_text()) for k in ("single", "0", "1")}


WRAPS = ["ddp", "fsdp2"]


@pytest.mark.parametrize("how", WRAPS)
@pytest.mark.parametrize("name", ["delayed", "current"])
def test_ranks_agree_exactly(runs: dict[str, dict], how: str, name: str) -> None:
    r0, r1 = runs["0"][f"{how}-{name}"], runs["1"][f"{how}-{name}"]
    assert r0.keys() == r1.keys()
    assert any(k.endswith("scale") for k in r0)
    for key in r0:
        np.testing.assert_array_equal(np.array(r0[key]), np.array(r1[key]), err_msg=key)


@pytest.mark.parametrize("how", WRAPS)
@pytest.mark.parametrize("name", ["delayed", "current"])
def test_matches_one_process_on_the_whole_batch(runs: dict[str, dict], how: str,
                                                name: str) -> None:
    single, r0 = runs["single"][name], runs["0"][f"{how}-{name}"]
    for key in single:
        np.testing.assert_allclose(np.array(r0[key]), np.array(single[key]), rtol=1e-5,
                                   atol=1e-6, err_msg=key)


@pytest.mark.parametrize("how", WRAPS)
def test_local_mean_loss_halves_only_the_dy_scale(runs: dict[str, dict], how: str) -> None:
    # what docs/torch.md states: the reduction makes the scales equal across ranks; x and W
    # scales are the one-process ones, the dy scale is 1 / world size of it (dy of the local
    # mean loss is world size times the one-process dy)
    # (the scales of the last step come from weights that match to rtol 1e-5, see above)
    single, r0, r1 = runs["single"]["current"], runs["0"][f"{how}-mean"], runs["1"][f"{how}-mean"]
    for layer in ("0", "2"):
        assert r0[f"{layer}.scale"] == r1[f"{layer}.scale"]
        scale, want = np.array(r0[f"{layer}.scale"]), np.array(single[f"{layer}.scale"])
        np.testing.assert_allclose(scale[:2], want[:2], rtol=1e-5)  # x, W
        np.testing.assert_allclose(scale[2] * 2, want[2], rtol=1e-5)  # dy
    for key in single:
        if key.endswith(("weight", "bias")):
            np.testing.assert_allclose(np.array(r0[key]), np.array(single[key]), rtol=1e-5,
                                       atol=1e-6, err_msg=key)


@pytest.mark.parametrize("how", WRAPS)
def test_without_amax_reduction_ranks_use_different_scales(runs: dict[str, dict],
                                                           how: str) -> None:
    # control: each rank scales by the amax of its own half batch (rows 0-31 are smaller)
    r0, r1 = runs["0"][f"{how}-current_unreduced"], runs["1"][f"{how}-current_unreduced"]
    assert r0["0.scale"] != r1["0.scale"]
    single = runs["single"]["current_unreduced"]
    diff = max(float(np.max(np.abs(np.array(r0[k]) - np.array(single[k])))) for k in single
               if k.endswith("weight"))
    assert diff > 1e-4


def test_accumulation_over_ranks_and_micro_batches_matches_one_process(
        runs: dict[str, dict]) -> None:
    # 2 ranks x 2 micro-batches in training_step: the step's amax is the max over all four
    # quarters of the batch, reduced once per step, as the one-process run's whole batch
    r0, r1 = runs["0"]["ddp-accumulated"], runs["1"]["ddp-accumulated"]
    single = runs["single"]["delayed"]
    assert r0.keys() == single.keys()
    for key in single:
        np.testing.assert_array_equal(np.array(r0[key]), np.array(r1[key]), err_msg=key)
        np.testing.assert_allclose(np.array(r0[key]), np.array(single[key]), rtol=1e-5,
                                   atol=1e-6, err_msg=key)
