"""`inspect` under DistributedDataParallel: statistics reduced over the ranks, rank 0 writes.

Two gloo processes on CPU (torch.multiprocessing, spawn), run by a script in a subprocess
with a timeout so that a hung collective cannot hang the suite. Each rank runs one step of
a DDP-wrapped MLP on its half of a batch under MX, whose blocks run along each row of the
input and the output gradient, so a row is quantised the same way whatever rank holds it;
a one-process run inspects the same model on the whole batch. The loss is `sum / global
batch`, so each rank's output gradient equals the one-process rows.

Tolerances: the reduced counts, fractions, amax, ranges and scales of the input and of the
last layer's output gradient equal the one-process values exactly (the same rows and the
same blocks: sums of integers, maxima of the same floats); SQNR rtol 1e-12 (two float64
partial sums against one). The weight is the same on both ranks, so its counts double and
its fractions and SQNR stay the same. The first layer's output gradient comes out of a
dgrad GEMM whose float32 summation may depend on the batch size: rtol 1e-5 for its amax
and SQNR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from normlab.torch import MXRecipe, inspect

    WORLD = 2

    def data():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 32, generator=g)
        x[:, 3] *= 1e3
        return x, torch.randn(64, 16, generator=g)

    def model():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                   torch.nn.Linear(64, 16))

    def step(net, x, y, path):
        with inspect(net, MXRecipe(), path=path) as log:
            loss = ((net(x) - y) ** 2).sum() / 64
            loss.backward()
            log.step()
        return log.records

    def worker(rank, base):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + base + ".rdv",
                                rank=rank, world_size=WORLD)
        x, y = data()
        rows = slice(rank * 32, rank * 32 + 32)
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        records = step(ddp, x[rows], y[rows], base + ".log.jsonl")
        del ddp
        gc.collect()
        dist.destroy_process_group()
        with open(base + f".{rank}.json", "w") as f:
            json.dump(records, f)

    if __name__ == "__main__":
        base = sys.argv[1]
        torch.set_num_threads(1)
        x, y = data()
        with open(base + ".single.json", "w") as f:
            json.dump(step(model(), x, y, None), f)
        mp.spawn(worker, args=(base,), nprocs=WORLD, join=True)
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    tmp = tmp_path_factory.mktemp("ddp_inspect")
    script = tmp / "ddp_inspect.py"
    script.write_text(SCRIPT)
    base = str(tmp / "run")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script), base], env=env, timeout=240,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {k: json.loads(Path(f"{base}.{k}.json").read_text()) for k in ("single", "0", "1")}
    out["file"] = [json.loads(line) for line in Path(base + ".log.jsonl").read_text().splitlines()]
    return out


def _by_key(records: list, prefix: str = "") -> dict:
    return {(r["module"][len(prefix):], r["tensor"]): r for r in records}


EXACT = ("underflow", "overflow", "amax", "nonfinite", "dynamic_range", "worst_block_range",
         "scale_min", "scale_max")


def test_ranks_hold_the_same_reduced_records(runs):
    assert runs["0"] == runs["1"]
    assert {r["ranks"] for r in runs["0"]} == {2}


def test_only_rank_0_writes_and_the_file_holds_the_records(runs):
    assert runs["file"] == runs["0"]  # rank 1 opened no file: rank 0's lines are all there


def test_reduced_statistics_equal_the_one_process_run(runs):
    single, reduced = _by_key(runs["single"]), _by_key(runs["0"], "module.")
    assert single.keys() == reduced.keys() and len(single) == 6
    for key in (("0", "input"), ("2", "input"), ("2", "grad_output")):
        s, r = single[key], reduced[key]
        assert r["numel"] == s["numel"], key
        for field in EXACT:
            assert r[field] == s[field], (key, field)
        assert r["sqnr_db"] == pytest.approx(s["sqnr_db"], rel=1e-12)
    for module in ("0", "2"):
        s, r = single[(module, "weight")], reduced[(module, "weight")]
        assert r["numel"] == 2 * s["numel"]
        assert all(r[f] == s[f] for f in EXACT) and r["sqnr_db"] == s["sqnr_db"]
    s, r = single[("0", "grad_output")], reduced[("0", "grad_output")]
    assert r["numel"] == s["numel"]
    assert r["amax"] == pytest.approx(s["amax"], rel=1e-5)
    assert r["sqnr_db"] == pytest.approx(s["sqnr_db"], rel=1e-5)
