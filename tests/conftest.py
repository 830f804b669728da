"""Shared pytest fixtures and format lists: randomness is always passed in, seeded per test.

The format lists are imported by the precision tests (``from conftest import ML_PAIRS``):
each named format with an ml_dtypes (or numpy) storage type, so a new format is added to
every oracle comparison in one place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import NAMED_FORMATS, get_format

# pytest puts tests/ on sys.path, where the folder tests/torch would be imported as an empty
# namespace package named "torch" when PyTorch is not installed; make that import fail, so
# pytest.importorskip("torch") skips as it should.
_torch = importlib.util.find_spec("torch")
if _torch is not None and _torch.origin is None:
    sys.modules["torch"] = None  # type: ignore[assignment]

# Multi-threaded kernels compile in this process, not in the background helper: a check of
# the multi-threaded path must run it, not the serial version that serves while the helper
# compiles (tests/kernels/test_background_compile.py turns the helper on where it is tested).
os.environ["NORMLAB_BACKGROUND_COMPILE"] = "0"

# format name -> the numpy / ml_dtypes type that stores it (the independent oracle)
ML_TYPES: dict[str, type] = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
}
# (Format, ml_dtypes type): every named format below float32, plus two ExMy names
ML_PAIRS = [(f, ML_TYPES[f.name]) for f in NAMED_FORMATS if f.bits < 32] + [
    (get_format("e3m4"), ml_dtypes.float8_e3m4),
    (get_format("float8_e4m3"), ml_dtypes.float8_e4m3),
]
# ml_dtypes < 0.7 sends float32 subnormals in (2^-127, 1.5 * 2^-127) up to 2^-126 in E8M0;
# 0.7 rounds the value, as normlab does. Detected here, not assumed from a version number,
# so the comparisons follow whichever release is installed.
ML_DTYPES_E8M0_SUBNORMAL_UP = float(
    np.array([1.25 * 2.0**-127], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    .astype(np.float64)[0]) == 2.0**-126
FNUZ_FORMATS = [get_format(n) for n in ("e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz")]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A Generator seeded from the test's name: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


class _QuickResults:
    """``quick_results[name]``: a lab experiment's result at Settings("quick", 0), run once."""

    def __init__(self) -> None:
        self._done: dict[str, object] = {}

    def __getitem__(self, name: str) -> object:
        if name not in self._done:
            from normlab.lab.experiments import load  # the lab only where a test asks for it
            from normlab.lab.result import ExperimentSkipped, NullProgress, Settings

            try:
                self._done[name] = load(name).run(Settings("quick", 0), NullProgress())
            except ExperimentSkipped as exc:  # an optional dependency (PyTorch) is missing
                pytest.skip(str(exc))
        return self._done[name]


@pytest.fixture(scope="session")
def quick_results() -> _QuickResults:
    """Each lab experiment run once per session at its quick size (tests/lab share them)."""
    return _QuickResults()
