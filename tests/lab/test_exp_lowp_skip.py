"""lowp_training with a PyTorch that normlab.torch does not support: SKIPPED, not ERROR."""

from __future__ import annotations

import pytest

from normlab.lab.experiments import lowp_training as exp
from normlab.lab.result import ExperimentSkipped, NullProgress, Settings


def test_an_unsupported_torch_skips_the_experiment(monkeypatch):
    # torch imports, but normlab.torch refuses its version (as on torch 2.11): the report
    # must count the experiment SKIPPED with the reason, not turn it into an error
    real = exp.importlib.import_module

    def old_torch(name, *args, **kwargs):
        if name == "torch":
            return object()  # any torch at all
        if name == "normlab.torch":
            raise ImportError("normlab.torch needs torch >= 2.13 (found torch 2.11.0)")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(exp.importlib, "import_module", old_torch)
    with pytest.raises(ExperimentSkipped, match=r"found torch 2\.11\.0"):
        exp.run(Settings("quick", 0), NullProgress())
