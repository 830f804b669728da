"""Optional dependencies of the lab (matplotlib, tqdm), imported only here and in `lab/`.

The library itself never imports them; the `lab` extra installs them (from a source
tree: `pip install ".[lab]"`; or by name: `pip install matplotlib tqdm threadpoolctl`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["LAB_EXTRA_HINT", "require"]

LAB_EXTRA_HINT = (
    "pip install matplotlib tqdm threadpoolctl "
    '(or, in normlab\'s source tree, pip install ".[lab]")'
)


def require(module: str) -> ModuleType:
    """Import `module` or raise ImportError saying how to install the lab extra.

    >>> require("json").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise ImportError(
            f"the normlab lab needs {top!r}, which is not installed; run: {LAB_EXTRA_HINT}"
        ) from exc
