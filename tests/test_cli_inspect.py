"""`normlab inspect LOG.jsonl --out DIR`: the report of an inspector log, and malformed logs.

The log here is written by hand (plain records, no torch): two layers, two recipes, two
steps; layer `b`'s input under the FP8 recipe loses 30% of its values, so it is the worst
operand and the only flagged layer. A malformed log exits 2 with one line on stderr and
no traceback, like every usage error of the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.cli import main

pytest.importorskip("matplotlib")

FP8 = "Fp8CurrentRecipe(margin=0)"
MX = "MXRecipe(elem='e4m3')"


def _record(step, module, tensor, recipe, underflow=0.0, sqnr=30.0):
    return {"step": step, "module": module, "tensor": tensor, "recipe": recipe,
            "format": "float8_e4m3fn", "amax": 1.0, "underflow": underflow, "overflow": 0.0,
            "sqnr_db": sqnr, "worst_block_range": None}


def _log(path: Path) -> Path:
    rows = [_record(step, m, t, r, underflow=0.3 if (m, t, r) == ("b", "input", FP8) else 0.0)
            for step in (0, 1) for r in (FP8, MX) for m in ("a", "b")
            for t in ("input", "weight", "grad_output")]
    rows[0]["sqnr_db"] = float("inf")  # an exact operand, written as Infinity
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_report_and_recommendation(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["inspect", str(_log(tmp_path / "log.jsonl")), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].split()[:3] == ["b", "input", "Fp8CurrentRecipe"]
    assert '"b": None,  # input loses 30.0%' in printed
    assert (out / "report.html").read_text().count("<img ") == 1 + 2 * 3
    recommendation = (out / "recommendation.py").read_text()
    compile(recommendation, "recommendation.py", "exec")  # valid Python, ready to paste
    assert f'"*": {MX},' in recommendation


@pytest.mark.parametrize("text, message", [
    ("not json\n", "log.jsonl:1: not JSON"),
    ("[1, 2]\n", "log.jsonl:1: expected a JSON object"),
    ('{"step": 0}\n', "log.jsonl:1: field 'module' must be a string; got None"),
    (json.dumps(_record("x", "a", "input", FP8)) + "\n", "field 'step' must be an integer"),
    (json.dumps(_record(0, "a", "bias", FP8)) + "\n", "field 'tensor' must be one of"),
    (json.dumps(_record(0, "a", "input", FP8, underflow=2.0)) + "\n", "must be a fraction"),
    ("\n", "no records"),
])
def test_malformed_log_is_one_line_exit_2(tmp_path, capsys, text, message):
    log = tmp_path / "log.jsonl"
    log.write_text(text)
    assert main(["inspect", str(log), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("normlab inspect: error: ") and message in err


def test_missing_log_and_out_that_is_a_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["inspect", str(_log(tmp_path / "log.jsonl")), "--out",
                 str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_command_line_prints_no_traceback(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text("{broken\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, "-m", "normlab", "inspect", str(log)], timeout=120,
                          capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
