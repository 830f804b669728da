"""Modules that moved in the layout by concern stay importable under their old names.

A package lists its moved modules as `{old name: new module}`; `keep_old_paths` makes the
old dotted path name the new module object itself (an entry in `sys.modules` and an
attribute of the package), so `import normlab.precision.recipes`, `from
normlab.precision.mx import mx_quantize` and pickles that name an old path keep working,
with the same objects, not copies.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["keep_old_paths"]


def keep_old_paths(package: str, moved: dict[str, str]) -> None:
    """Make `package.old` import as the module `new` for each entry of `moved`.

    The package attribute `old` is set only where the package has no attribute of that
    name: as before the move, `normlab.torch.convert` is the function, while `import
    normlab.torch.convert` gives the module.

    Parameters
    ----------
    package : str
        The dotted name of the package the modules used to live in (already imported).
    moved : dict of str to str
        Old module name (without the package) to the new module's dotted name.
    """
    parent = sys.modules[package]
    for old, new in moved.items():
        module = importlib.import_module(new)
        sys.modules[f"{package}.{old}"] = module
        if not hasattr(parent, old):  # `normlab.torch.convert` stays the function
            setattr(parent, old, module)
