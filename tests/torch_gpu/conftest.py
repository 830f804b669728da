"""GPU tests of normlab.torch: ``python -m pytest tests/torch_gpu -m cuda`` on a CUDA machine.

Every test here carries the ``cuda`` marker and is skipped when torch or CUDA is missing.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
