"""The benchmark's smoke run: correctness checks pass and the JSON report is complete.

No timing is asserted (timings depend on the machine and its load); only that every op
was measured, checked and written.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from normlab import bench
from normlab.bench import bandwidth as bench_bandwidth
from normlab.bench import table as bench_table
from normlab.bench.norm_cases import SMALL_SHAPES
from normlab.bench.timing import measure


def test_quick_run_checks_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--no-compile", "--budget", "0.05", "--only", "kernels",
                       "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["correct"] is True and report["info"]["kernels"] is True
    ops = {(r["op"], tuple(r["shape"])) for r in report["rows"]}
    for shape in ((8, 64), (64, 512)):  # the small-size rows: norms only
        assert {("layer_norm fwd+bwd", shape), ("rms_norm fwd+bwd", shape)} <= ops
    plain = {"layer_norm fwd+bwd", "rms_norm fwd+bwd", "quantize bf16 nearest",
             "quantize e4m3 nearest", "batch_norm fwd+bwd", "group_norm fwd+bwd"}
    forward = {"layer_norm fwd out=", "rms_norm fwd out="}
    assert {op for op, _ in ops} == plain | {op + " out=" for op in plain} | forward
    for row in report["rows"]:
        assert 0 < row["normlab_min_s"] <= row["normlab_s"]
        assert row["op"].endswith("out=") or row["numpy_s"] > 0
        assert row["normlab_spread"] >= 0 and row["normlab_samples"] >= 10
        assert row["check"]  # correctness was checked before timing
        assert ("bound_s" in row) == (tuple(row["shape"]) not in SMALL_SHAPES)
        assert all(v is True or (isinstance(v, float) and v <= 1) for v in row["check"].values())
        if row["op"].startswith(("layer_norm", "rms_norm")) and row["op"].endswith("out="):
            # timed against the all-core copy in the same rounds (see the next test)
            copies = 1.0 if " fwd out=" in row["op"] else 2.5
            assert row["bound_s"] == pytest.approx(copies * row["copy_s"], rel=1e-12)
            assert row["bound_ratio"] > 0 and row["bound_ratio_spread"] >= 0
    text = capsys.readouterr().out
    assert "correctness: ok" in text and "PyTorch / normlab" in text
    assert "{" not in text  # the raw JSON only goes to the --json file
    assert "normlab median" in text and "spread" in text


def test_markdown_table_and_noise_warnings():
    row = {"op": "rms_norm fwd+bwd", "shape": [8, 64], "normlab_s": 2e-5, "normlab_min_s": 1e-5,
           "normlab_spread": 0.25, "torch_s": 4e-5, "torch_min_s": 3e-5, "torch_spread": 0.01}
    md = bench_table.table([row], markdown=True).splitlines()
    assert md[0].startswith("| op (float32) | shape | normlab median |")
    assert md[2] == ("| RMSNorm fwd+bwd | 8x64 | 20.0 us | 10.0 us | 25% | - | 40.0 us | - | - "
                     "| - | - | 2.00x | - |")
    warnings = bench_table._noise_warnings([row], (3.0, 2))
    assert "load average 3.00 on 2 cores" in warnings[0]
    assert "1 timings have a spread above 10%" in warnings[1] and "normlab rms_norm" in warnings[1]
    assert bench_table._noise_warnings([{**row, "normlab_spread": 0.05}], (0.1, 2)) == []


def test_against_copy_alternates_the_op_with_the_copy_of_the_same_bytes(monkeypatch):
    """Each round times the op, then the copy (or the reverse): both see the same rounds."""
    calls: list[str] = []
    x = np.ones((64, 256), np.float32)
    module = bench_bandwidth._parallel_copy_module()
    real = module.parallel_copy

    def spy(src, dst):
        calls.append(f"copy {src.nbytes}")
        real(src, dst)

    monkeypatch.setattr(module, "parallel_copy", spy)
    fields = bench_bandwidth.against_copy(lambda: calls.append("op"), x, 2.5, budget=0.0)
    assert fields["normlab_samples"] == 10  # the minimum number of rounds
    assert {c for c in calls if c != "op"} == {f"copy {x.nbytes}"}  # all of x, each time
    assert fields["bound_s"] == 2.5 * fields["copy_s"] and fields["bound_ratio"] > 0
    row = {"op": "rms_norm fwd out=", "shape": [64, 256], **fields, "bound_ratio": 1.234}
    assert bench_table._cells(row)[9:11] == ["1.23x", "1.23x"]  # the rounds' median ratio


def test_measure_reports_min_median_spread():
    calls = []
    t = measure(lambda: calls.append(1), budget_s=0.05, batch=4)
    assert 0 < t.min_s <= t.median_s and t.spread >= 0 and t.samples >= 8
    assert len(calls) >= t.samples  # each sample is a loop of at least one call (+ warm-up)


def test_everything_works_without_numba():
    """numba blocked in a child process: the references serve and the bench still runs."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import numpy as np, normlab as nl\n"
        "from normlab._backend import kernel\n"
        "from normlab.precision import quantize\n"
        "assert kernel('layer_norm_forward') is None and kernel('quantize') is None\n"
        "out, c = nl.layer_norm_forward(np.ones((2, 3), np.float32), None, None)\n"
        "assert quantize(np.float32([1.0 + 2**-9]), 'bf16')[0] == 1.0\n"
        "from normlab import bench\n"
        "assert bench.main(['--quick', '--no-compile', '--repeats', '1']) == 0\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not checked (no kernels)" in proc.stdout
