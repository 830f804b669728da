"""The cold-start bench entry: the first converted training step in fresh processes.

No timing is asserted (speed lives in `normlab bench`): the entry must return positive
seconds for an empty cache (helper on and off) and a warm one, and its check (the same
loss and gradient norm bit for bit in every child) must pass, and must show when it fails.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from normlab.bench import command
from normlab.bench import compile_time as ct


def test_cold_start_of_one_recipe_is_measured_and_checked() -> None:
    times = ct.torch_cold_start(("Bf16Recipe",))
    assert list(times) == ["Bf16Recipe"]
    t = times["Bf16Recipe"]
    for key in ("cold_s", "helper_s", "inline_s", "warm_s", "import_s"):
        assert t[key] > 0, key  # type: ignore[operator]
    assert t["helper_s"] >= t["cold_s"]  # type: ignore[operator]
    assert t["same_result"] is True
    text = ct.format_cold_start(times)
    assert "Bf16Recipe" in text and "check ok" in text


def test_a_differing_warm_result_fails_the_bench(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake = {"Bf16Recipe": {"cold_s": 1.0, "helper_s": 1.5, "inline_s": 2.0, "warm_s": 0.5,
                           "import_s": 2.0, "same_result": False}}
    monkeypatch.setattr(command, "torch_cold_start", lambda: fake)
    assert command.main(["--quick", "--only", "cold-start"]) == 1
    assert "FAILED (results differ)" in capsys.readouterr().out
    assert command.main(["--quick", "--only", "cold-start", "--no-compile"]) == 0  # skipped
