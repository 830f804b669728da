"""The benchmark package's timing helper and its torch-free import (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab.bench import main
from normlab.bench.memory import peak_extra
from normlab.bench.timing import Alternation, alternate


def test_alternation_ratios_from_known_samples():
    t = Alternation(a_s=(2.0, 4.0, 6.0), b_s=(1.0, 1.0, 2.0))
    assert t.ratio == 3.0  # median of the rounds' ratios 2, 4, 3
    assert t.ratio_of_medians == 4.0  # 4 / 1
    assert t.ratio_of_minima == 2.0  # 2 / 1
    # quantiles (exclusive method) of 2, 3, 4: q1 = 2, q3 = 4; spread (4 - 2) / 3
    assert t.ratio_spread == pytest.approx(2 / 3, rel=1e-12)


def test_alternate_swaps_the_order_every_round_after_the_warm_up():
    calls: list[str] = []
    t = alternate(lambda: calls.append("a"), lambda: calls.append("b"), rounds=3, inner=2)
    warm_up, *rounds = ["a", "b"], ["a", "a", "b", "b"], ["b", "b", "a", "a"], ["a", "a", "b", "b"]
    assert calls == [*warm_up, *rounds[0], *rounds[1], *rounds[2]]
    assert len(t.a_s) == len(t.b_s) == 3 and min(t.a_s + t.b_s) > 0


def test_alternate_syncs_after_every_sample():
    events: list[str] = []
    alternate(lambda: events.append("a"), lambda: events.append("b"), rounds=2,
              sync=lambda: events.append("sync"), warmup=0)
    assert events == ["a", "sync", "b", "sync", "b", "sync", "a", "sync"]


def test_peak_extra_sees_a_new_array():
    np = pytest.importorskip("numpy")
    assert peak_extra(lambda: np.ones(1 << 18)) >= 8 << 18
    assert peak_extra(lambda: None) < 1 << 16


def test_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--only", "kernels,nosuchsection"])
    assert stop.value.code == 2
    assert "nosuchsection" in capsys.readouterr().err


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)


def test_importing_the_bench_imports_no_torch():
    proc = _child("import sys, normlab.bench, normlab.cli\nprint('torch' in sys.modules)")
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_without_torch_the_torch_sections_say_so_and_pass():
    # a process where "import torch" fails: the package imports and the torch sections
    # print the install line instead of running
    proc = _child(
        "import sys; sys.modules['torch'] = None\n"
        "from normlab.bench import main\n"
        "rc = main(['--quick', '--only', 'torch-quantize,training'])\n"
        "assert 'normlab.bench.training' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("emulated training: skipped") for line in lines)
    assert any(line.startswith("normlab.torch.quantize: skipped") for line in lines)
    assert 'pip install ".[torch]"' in proc.stdout
