"""The docs extra builds without PyTorch: every module the API reference imports loads.

`pip install ".[docs]" && mkdocs build --strict` (the README's third quick-start line)
installs no torch. The build's hook (docs/_hooks/normlab_docs.py) lists every public
module and what its `__all__` exports; importing them for that would break the line on
the bench's torch-only modules. The check runs the hook's listing in a fresh interpreter
where `import torch` fails, as it does without the `torch` extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # `import torch` raises ImportError, as without the extra
    sys.path.insert(0, sys.argv[1])
    import normlab_docs

    other = normlab_docs._other_names()
    pages = normlab_docs._api_pages()
    print("torch_quantize" in " ".join(other), sorted(pages))
    """
)


def test_the_api_listing_of_the_docs_build_needs_no_torch():
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ROOT / "docs" / "_hooks")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the torch-only bench module is still documented (its names on an API page)
    assert proc.stdout.startswith("True"), proc.stdout
