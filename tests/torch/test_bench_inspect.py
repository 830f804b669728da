"""`normlab bench --only inspect`: the inspector's overhead rows, checked before they are timed.

No timing is asserted (speed is what the benchmark reports); only that both `every` rows
are there, that the bit-identity check passes, and that it fails, making the bench exit 1,
when the hooks change what the model computes.
"""

from __future__ import annotations

import json

from normlab.bench import command
from normlab.bench import inspect_overhead as io
from normlab.torch.numerics import _hooks


def test_quick_section_has_both_rows_and_is_bit_identical():
    section = io.inspect_section(quick=True, rounds=1)
    assert section["ok"] is True
    assert [r["every"] for r in section["rows"]] == list(io.EVERY)
    assert all(r["ratio"] > 0 for r in section["rows"])
    assert "bit-identical with and without the inspector: ok" in io.format_inspect(section)


def test_the_bench_fails_when_the_hooks_change_the_model(monkeypatch, tmp_path, capsys):
    record = _hooks._record

    def meddling(log, name, tensor, q, t):  # a hook that writes into the weight
        record(log, name, tensor, q, t)
        if tensor == "weight":
            t.data.mul_(1.0 + 2**-10)

    monkeypatch.setattr(_hooks, "_record", meddling)
    path = tmp_path / "bench.json"
    assert command.main(["--quick", "--only", "inspect", "--rounds", "1", "--json",
                         str(path)]) == 1
    assert "bit-identical with and without the inspector: FAILED" in capsys.readouterr().out
    assert json.loads(path.read_text())["inspect"]["ok"] is False
