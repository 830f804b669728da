"""Modules and arguments that were renamed stay usable under their old names.

A package lists its moved modules as `{old name: new module}`; `keep_old_paths` makes the
old dotted path name the new module object itself (an entry in `sys.modules` and an
attribute of the package), so `import normlab.precision.recipes`, `from
normlab.precision.mx import mx_quantize` and pickles that name an old path keep working,
with the same objects, not copies. `renamed_arguments` does the same for keyword
arguments renamed so that the NumPy and torch twins use one name.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["keep_old_paths", "renamed_arguments"]

F = TypeVar("F", bound=Callable[..., Any])


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


def renamed_arguments(**old_to_new: str) -> Callable[[F], F]:
    """Accept each keyword argument `old` for `new`, with a DeprecationWarning.

    For an argument whose name changed so that the NumPy functions and their torch twins
    speak alike (`t` became `x`, `mode` became `param_rounding`): positional calls are
    untouched, `old=` still works and warns, and passing both names is a TypeError.

    Parameters
    ----------
    **old_to_new : str
        The old keyword name to the new one.

    Returns
    -------
    decorator : callable
        Wraps a function (or `__init__`) so that it takes the old keywords.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got {new!r} and its old name "
                                        f"{old!r}; pass {new!r} only")
                    warnings.warn(f"{fn.__qualname__}({old}=...) is deprecated; the argument "
                                  f"is now {new!r}", DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return cast(F, wrapper)

    return decorate
