"""The one dispatch point between the NumPy references and the fused kernels.

Contract: a public function validates its inputs, then asks :func:`kernel` for a compiled
implementation registered under the function's name. A kernel receives exactly the
validated arguments of the reference implementation and returns either the same result
(same types, same cache class) or ``NotImplemented`` when it cannot serve those inputs
(a dtype, layout or option it does not handle); the caller then runs the reference.

``NORMLAB_BACKEND=numpy`` (read at every call) or a missing numba selects the references.
``NORMLAB_BACKEND=numba`` (or unset) uses the kernels where they exist.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["backend", "kernel", "register", "use_backend"]

_REGISTRY: dict[str, Callable[..., Any]] = {}
_LOADED = False
_AVAILABLE = False
_LOCK = threading.Lock()
_OVERRIDE: list[str] = []
_BACKENDS = ("numba", "numpy")


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator used by :mod:`normlab.kernels` to offer a kernel for a public function."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[name] = fn
        return fn

    return deco


def backend() -> str:
    """The backend in force: ``"numba"`` or ``"numpy"``."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    value = os.environ.get("NORMLAB_BACKEND", "numba").strip().lower() or "numba"
    if value not in _BACKENDS:
        raise ValueError(f"NORMLAB_BACKEND must be one of {_BACKENDS}; got {value!r}")
    return value


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Temporarily select a backend (tests and benchmarks compare the two this way)."""
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}; got {name!r}")
    _OVERRIDE.append(name)
    try:
        yield
    finally:
        _OVERRIDE.pop()


def _load() -> bool:
    global _LOADED, _AVAILABLE
    with _LOCK:
        if not _LOADED:
            try:
                import normlab.kernels  # noqa: F401  (registers its kernels on import)

                _AVAILABLE = True
            except ImportError:  # numba missing: every public function still works
                _AVAILABLE = False
            _LOADED = True
    return _AVAILABLE


def kernel(name: str) -> Callable[..., Any] | None:
    """The compiled kernel registered for ``name``, or None when the reference must run."""
    if backend() == "numpy" or not _load():
        return None
    return _REGISTRY.get(name)
