"""Build the documentation site once per test session (strict: any warning fails).

Not a conftest.py: other test folders import names from their own ``conftest`` module, and a
second module of that name here would shadow theirs. Test modules define a ``site``
fixture that returns :func:`build_site`.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def build_site() -> Path:
    """The built site's folder (built on first call, shared by every docs test)."""
    out = Path(tempfile.mkdtemp(prefix="normlab-site-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    return out
