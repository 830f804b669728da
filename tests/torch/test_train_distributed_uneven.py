"""Ranks that skip quantisation never leave the others waiting in an amax all-reduce.

Two gloo processes on CPU (torch.multiprocessing, spawn) run by a script in a subprocess
with a timeout, and the process group has a short collective timeout, so that a hung or
mismatched collective fails the test instead of hanging the suite. Each run trains a small
converted MLP under DistributedDataParallel or FSDP2 for two steps, then:

- an uneven last batch: rank 1's share of the last training batch has no rows (rank 0 has
  all of it); the empty rank must still enter the amax all-reduces of its training
  forward and backward (FP8 current scaling) and of the next step's scale update (FP8
  delayed scaling), or the ranks' collectives mismatch;
- an evaluation by rank 0 alone (DDP: `model.eval()` under `torch.no_grad()` on the
  wrapped module while rank 1 waits at a barrier; FSDP2, whose own parameter all-gathers
  need every rank in each forward: an evaluation where rank 1's batch has no rows), which
  must enter no amax collective;
- a last training step on both ranks, whose collectives must still pair up.

Both ranks then report their recipe state and weights: the collectives give every rank
the same bits (tolerance 0). MX reduces nothing and is the control that passes either way.
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
    import datetime, gc, json, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.fsdp import fully_shard
    from normlab.torch import QuantLinear, convert
    from normlab.torch.training._extra_state import unpack_extra_state
    from normlab.torch.recipes import (
        Fp8CurrentRecipe, Fp8DelayedRecipe, Fp8RowwiseRecipe, MXRecipe)

    RECIPES = {"delayed": Fp8DelayedRecipe(amax_history_len=4), "current": Fp8CurrentRecipe(),
               "mx": MXRecipe(), "rowwise_gw_hp": Fp8RowwiseRecipe(True)}

    def worker(rank, how, name, path):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + path + ".rdv", rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=30))
        torch.manual_seed(0)
        net = convert(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(),
                                          torch.nn.Linear(32, 8)), RECIPES[name])
        if how == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(net)
        else:
            for m in net:
                if isinstance(m, QuantLinear):
                    fully_shard(m)
            model = fully_shard(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        batches = [torch.randn(8, 32, generator=g) for _ in range(4)]

        def step(x):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()

        for x in batches[:2]:
            step(x[rank * 4:rank * 4 + 4])
        step(batches[2] if rank == 0 else batches[2][:0])  # uneven: rank 1 gets no rows
        net.eval()
        with torch.no_grad():
            if how == "ddp" and rank == 0:
                net(batches[3])  # rank 0 evaluates alone
            elif how == "fsdp2":
                model(batches[3] if rank == 0 else batches[3][:0])
        net.train()
        dist.barrier()
        step(batches[3][rank * 4:rank * 4 + 4])
        for m in net.modules():
            if isinstance(m, QuantLinear):
                m.update_scales()  # the end of the last step (a collective for delayed)
        out = {}
        for k, v in net.state_dict().items():
            if k.endswith("_extra_state"):
                out.update({k + "." + n: t.tolist() for n, t in unpack_extra_state(v).items()
                            if isinstance(t, torch.Tensor)})
            else:
                out[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).tolist()
        del opt, model, net
        gc.collect()
        dist.destroy_process_group()
        with open(path + f".{rank}.json", "w") as f:
            json.dump(out, f)

    if __name__ == "__main__":
        how, name, path = sys.argv[1:4]
        mp.spawn(worker, args=(how, name, path), nprocs=2, join=True)
    """
)


def _run(tmp_path: Path, how: str, name: str) -> list[dict]:
    script = tmp_path / "uneven.py"
    script.write_text(SCRIPT)
    base = str(tmp_path / "run")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run([sys.executable, str(script), how, name, base], env=env,
                              timeout=150, capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:  # a hung collective
        pytest.fail(f"{how}/{name}: the ranks hung (timeout): {str(e.stderr)[-2000:]}")
    assert proc.returncode == 0, f"{how}/{name}: {proc.stderr[-3000:]}"
    return [json.loads(Path(f"{base}.{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("name", ["delayed", "current", "mx", "rowwise_gw_hp"])
@pytest.mark.parametrize("how", ["ddp", "fsdp2"])
def test_uneven_batch_and_evaluation_on_one_rank_complete(tmp_path: Path, how: str,
                                                          name: str) -> None:
    r0, r1 = _run(tmp_path, how, name)
    assert r0.keys() == r1.keys()
    assert name == "mx" or any(k.endswith(".scale") for k in r0)
    for key in r0:
        np.testing.assert_array_equal(np.array(r0[key]), np.array(r1[key]), err_msg=key)
