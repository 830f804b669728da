"""Lint and type checks run as part of the test suite, so CI enforces them.

Each test skips only when its tool is not installed (the ``test`` extra installs both).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def test_ruff_clean():
    proc = _run("ruff", "check", "src", "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_mypy_clean():
    proc = _run("mypy")  # files and strictness come from pyproject.toml
    assert proc.returncode == 0, proc.stdout + proc.stderr
