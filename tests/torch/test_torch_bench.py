"""The normlab.torch bench rows check correctness before timing (no timing asserted)."""

from __future__ import annotations

from normlab.bench.torch_quantize import format_rows, quantize_rows


def test_rows_are_checked_and_formatted():
    rows = quantize_rows((16, 32), ("bf16", "e4m3"), repeats=1, small=(2, 3))
    cpu = [(r["op"], r["shape"]) for r in rows if r["device"] == "cpu"]
    assert cpu == [("torch quantize bf16 nearest", [16, 32]),
                   ("torch quantize e4m3 nearest", [16, 32]),
                   ("torch quantize bf16 nearest", [2, 3]),
                   ("torch quantize e4m3 nearest", [2, 3])]
    assert all(r["bit_identical"] and r["torch_s"] > 0 and r["yardstick_s"] > 0
               and r["ratio_min"] > 0 for r in rows)
    assert len(format_rows(rows).splitlines()) == 2 + len(rows)
