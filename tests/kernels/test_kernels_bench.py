"""The benchmark's smoke run: correctness checks pass and the JSON report is complete.

No timing is asserted (timings depend on the machine and its load); only that every op
was measured, checked and written.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("numba")

from normlab import bench


def test_quick_run_checks_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--no-compile", "--repeats", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["correct"] is True and report["info"]["kernels"] is True
    ops = {r["op"] for r in report["rows"]}
    assert ops == {"layer_norm fwd+bwd", "rms_norm fwd+bwd", "quantize bf16 nearest",
                   "quantize e4m3 nearest"}
    for row in report["rows"]:
        assert row["normlab_s"] > 0 and row["numpy_s"] > 0 and row["bound_s"] > 0
        assert row["check"]  # correctness was checked before timing
    text = capsys.readouterr().out
    assert "correctness: ok" in text and "vs torch" in text


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = capsys.readouterr().out
    for option in ("--quick", "--json", "--repeats", "--no-compile"):
        assert option in out


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
