"""The normlab.torch bench rows check correctness before timing (no timing asserted)."""

from __future__ import annotations

from normlab.torch.bench import format_rows, quantize_rows


def test_rows_are_checked_and_formatted():
    rows = quantize_rows((16, 32), ("bf16", "e4m3"), repeats=1)
    cpu = [r for r in rows if r["device"] == "cpu"]
    assert [r["op"] for r in cpu] == ["torch quantize bf16 nearest",
                                      "torch quantize e4m3 nearest"]
    assert all(r["bit_identical"] and r["torch_s"] > 0 and r["yardstick_s"] > 0 for r in rows)
    assert len(format_rows(rows).splitlines()) == 2 + len(rows)
