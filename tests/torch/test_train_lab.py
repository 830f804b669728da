"""The lowp_training lab experiment: its claims, its sanity check, and a break it detects.

Runs at the quick size on a subset of the recipes (the full set is the experiment's job;
these tests check the machinery within the test budget).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.lab.experiments import EXPERIMENTS  # noqa: E402
from normlab.lab.experiments import lowp_training as exp  # noqa: E402
from normlab.lab.result import Settings  # noqa: E402
from normlab.lab.runner import run_experiments  # noqa: E402
from normlab.torch import _operands  # noqa: E402
from normlab.torch._fastround import round_elements  # noqa: E402


def _run(monkeypatch: pytest.MonkeyPatch, configs: tuple[str, ...]):
    monkeypatch.setattr(exp, "CONFIGS", configs)
    (outcome,) = run_experiments(["lowp_training"], Settings("quick", 0),
                                 loader=lambda name: exp)
    return outcome


def test_registered_and_declares_what_it_detects() -> None:
    assert "lowp_training" in EXPERIMENTS
    assert exp.DETECTS and all(isinstance(d, str) for d in exp.DETECTS)


def test_quick_run_trains_every_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = _run(monkeypatch, ("bf16", "fp8_current", "mxfp8"))
    assert outcome.status != "error", outcome.error
    res = outcome.result
    assert res is not None
    sanity = res.checks[0]
    assert sanity.source.startswith("sanity") and sanity.passed, sanity.measured
    # the same numbers restated: each loss is below the unigram entropy of the text by 0.2
    h = sanity.values["unigram_entropy"]
    losses = res.metrics["valid_loss"]
    assert set(losses) == {"bf16", "fp8_current", "mxfp8"}
    assert max(max(v) for v in losses.values()) <= h - 0.2
    # a failed paper claim says NOT REPRODUCED beside its numbers, a passed one does not
    for c in res.checks[1:]:
        assert c.measured.startswith("NOT REPRODUCED") == (not c.passed)
    gap = res.checks[1].values["gap"]
    np.testing.assert_allclose(gap, losses["fp8_current"][0] - losses["bf16"][0], rtol=1e-12)


def test_detects_fp8_operands_left_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    # the break of DETECTS[0]: per-tensor FP8 operands come back as sat_round(t * scale)
    # without the scale_inv factor (values ~448 / amax times too large): the run does not
    # train and the sanity check FAILs (a FAIL, not NOT REPRODUCED and not an ERROR)
    assert "scale_inv not applied" in exp.DETECTS[0]

    def left_scaled(t, fmt, scale):
        return round_elements(t.to(torch.float32) * scale, fmt, saturate=True)

    monkeypatch.setattr(_operands, "per_tensor", left_scaled)
    outcome = _run(monkeypatch, ("bf16", "fp8_current"))
    assert outcome.status == "fail", outcome.error
    assert not outcome.result.checks[0].passed


def test_without_torch_the_experiment_is_skipped_with_the_install_line() -> None:
    # a subprocess where "import torch" fails: the module still imports (the registry can
    # list it), and the runner reports "skipped" with the install line, exit status 0
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from normlab.lab.result import Settings\n"
        "from normlab.lab.runner import exit_status, run_experiments\n"
        "(o,) = run_experiments(['lowp_training'], Settings('quick', 0))\n"
        "print(o.status, exit_status([o]), o.error, sep='|')\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, code_, reason = proc.stdout.strip().split("|", 2)
    assert (status, code_) == ("skipped", "0")
    assert exp.TORCH_HINT in reason
