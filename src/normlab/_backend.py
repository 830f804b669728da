"""The one "kernel or reference" decision behind every public op.

Contract: a public function validates its inputs, then calls `dispatch` with the
op's name, its NumPy reference and the validated arguments. The kernel that `KERNELS`
names for that op (`"module:function"` in [normlab.kernels][], imported on the first
dispatch, never at import time) receives exactly those arguments and returns the reference's
result types, or `NotImplemented` when it cannot serve them (a dtype, layout or option it
does not handle); the reference then runs. Both paths run under the same
`np.errstate`: a NaN/inf row gives NaN/inf in that row only, without NumPy warnings.

Kernel faults never reach the caller. A failure to import, compile, cache, load or call a
kernel becomes one `KernelFallbackWarning` per cause (naming the cause and the fix),
then correct results:

1. numba cannot write its cache (read-only install, unwritable home: "no locator
   available", `PermissionError`): numba is pointed at a fresh temporary folder
   (`NUMBA_CACHE_DIR` semantics, removed when the process exits) and the kernels are
   loaded again;
2. a corrupted cache file (`UnpicklingError`, `EOFError` from a truncated `.nbi` /
   `.nbc`): the kernels' cache files are deleted where possible and the kernel is
   compiled again, so the cache heals itself;
3. anything else, or a retry that fails too: the NumPy reference, for this op from now on.

What is not a kernel fault reaches the caller and leaves the kernel on: a `MemoryError`
(an input too large for this machine: the reference would need as much) propagates
as it is, and when the reference fails on the same arguments too, its exception
propagates (the arguments are at fault, not the kernel). So one oversized or odd call
never changes which code, and which bits, later calls get.

A generator passed to a kernel (dropout) is restored before the reference runs, so a
fallback draws the same random numbers.

`NORMLAB_BACKEND=numpy` (read at every call) selects the references; `numba` (or
unset) uses the kernels where they exist.
"""

from __future__ import annotations

import atexit
import glob
import importlib
import os
import pickle
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = [
    "KERNELS",
    "KernelFallbackWarning",
    "backend",
    "dispatch",
    "kernel",
    "use_backend",
]

# op name -> "module:function" of its kernel. A table of names, not imports: the kernels
# import the references' modules (formats, caches), which dispatch through here, so only
# strings may point from this module to them (no import circle).
KERNELS: dict[str, str] = {
    "batch_norm_forward": "normlab.kernels.batch_norm:batch_norm_forward",
    "batch_norm_backward": "normlab.kernels.batch_norm:batch_norm_backward",
    "block_amax": "normlab.kernels.block_scale:block_amax",
    "inverted_dropout": "normlab.kernels.dropout:inverted_dropout",
    "group_norm_forward": "normlab.kernels.group_norm:group_norm_forward",
    "group_norm_backward": "normlab.kernels.group_norm:group_norm_backward",
    "quantize": "normlab.kernels.quantize:quantize",
    "fake_operand": "normlab.kernels.operand:fake_operand",
    "encode_operand": "normlab.kernels.operand:encode_operand",
    "fake_encode_operand": "normlab.kernels.operand:fake_encode_operand",
    "tensor_amax": "normlab.kernels.operand:tensor_amax",
    "decode_operand": "normlab.kernels.operand:decode_operand",
    "operand_stats": "normlab.kernels.operand_stats:operand_stats",
    "layer_norm_forward": "normlab.kernels.row_norms:layer_norm_forward",
    "layer_norm_backward": "normlab.kernels.row_norms:layer_norm_backward",
    "add_layer_norm_forward": "normlab.kernels.row_norms:add_layer_norm_forward",
    "add_layer_norm_backward": "normlab.kernels.row_norms:add_layer_norm_backward",
    "rms_norm_forward": "normlab.kernels.row_norms:rms_norm_forward",
    "rms_norm_backward": "normlab.kernels.row_norms:rms_norm_backward",
    "add_rms_norm_forward": "normlab.kernels.row_norms:add_rms_norm_forward",
    "add_rms_norm_backward": "normlab.kernels.row_norms:add_rms_norm_backward",
}
_REGISTRY: dict[str, Callable[..., Any]] = {}  # KERNELS resolved, once the kernels load
_STATE: dict[str, Any] = {"loaded": False, "available": False, "cache_moved": False}
_DISABLED: set[str] = set()  # ops whose kernel failed for good in this process
_WARNED: set[tuple[str, str]] = set()
_LOCK = threading.RLock()
_OVERRIDE = threading.local()  # .stack: this thread's use_backend choices, innermost last
_BACKENDS = ("numba", "numpy")
_CORRUPT = (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError)


class KernelFallbackWarning(RuntimeWarning):
    """A compiled kernel could not be used; normlab recovered (results stay correct)."""


def backend() -> str:
    """The backend in force: `"numba"` or `"numpy"`."""
    stack = getattr(_OVERRIDE, "stack", None)
    if stack:
        return str(stack[-1])
    raw = os.environ.get("NORMLAB_BACKEND")
    if raw is None:  # the common case, checked first: this runs on every call
        return "numba"
    value = raw.strip().lower() or "numba"
    if value not in _BACKENDS:
        raise ValueError(f"NORMLAB_BACKEND must be one of {_BACKENDS}; got {value!r}")
    return value


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Temporarily select a backend in this thread (tests and benchmarks compare the two
    this way); other threads keep theirs."""
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}; got {name!r}")
    if not hasattr(_OVERRIDE, "stack"):
        _OVERRIDE.stack = []
    _OVERRIDE.stack.append(name)
    try:
        yield
    finally:
        _OVERRIDE.stack.pop()


_FIX_CACHE = ("Fix: make the numba cache writable (set NUMBA_CACHE_DIR to a writable "
              "folder; a corrupted cache is deleted automatically), or set "
              "NORMLAB_BACKEND=numpy to use the NumPy references without this warning.")
_FIX_IMPORT = ("Fix: reinstall numba (pip install --force-reinstall numba) or make its cache "
               "writable (NUMBA_CACHE_DIR), or set NORMLAB_BACKEND=numpy to use the NumPy "
               "references without this warning.")
_FIX_KERNEL = ("This is a fault of normlab's kernel, not of your input or setup: please report "
               "it with the input's shape and dtype; set NORMLAB_BACKEND=numpy to use the "
               "NumPy references without this warning.")


def _warn_once(cause: BaseException, action: str, fix: str = _FIX_CACHE) -> None:
    key = (type(cause).__name__, str(cause)[:200])
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"normlab kernels: {type(cause).__name__}: {str(cause)[:300]}. {action} {fix}",
        KernelFallbackWarning,
        stacklevel=4,
    )


def _is_cache_location_error(exc: BaseException) -> bool:
    return isinstance(exc, PermissionError) or (
        isinstance(exc, RuntimeError) and "cannot cache" in str(exc)
    )


def _move_cache_to_tmp() -> bool:
    """Point numba's cache at a fresh temporary folder; False when already done."""
    if _STATE["cache_moved"]:
        return False
    folder = tempfile.mkdtemp(prefix="normlab-numba-cache-")
    # per process (a predictable shared name would let another user plant cache files),
    # removed at exit by the process that made it (not by forked children, which share it)
    atexit.register(_remove_folder, folder, os.getpid())
    os.environ["NUMBA_CACHE_DIR"] = folder  # read by numba when it is imported
    config = sys.modules.get("numba.core.config")  # already imported: set it there too
    if config is not None:
        setattr(config, "CACHE_DIR", folder)  # noqa: B010
    _STATE["cache_moved"] = True
    return True


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _forget_kernels() -> None:
    for mod in [m for m in sys.modules if m == "normlab.kernels" or
                m.startswith("normlab.kernels.")]:
        del sys.modules[mod]
    _REGISTRY.clear()


def _heal_cache() -> None:
    """Delete the kernels' numba cache files (index and data) wherever they can be found.

    Only normlab's own files: beside the package, every `.nbi` / `.nbc`; under
    `NUMBA_CACHE_DIR` (which other projects' numba caches may share) only the files of
    normlab's kernel modules, in numba's per-source-folder `kernels_<hash>` folders.
    """
    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    stems = [os.path.splitext(os.path.basename(f))[0]
             for f in glob.glob(os.path.join(kernels, "*.py"))]
    paths = [p for pattern in ("*.nbi", "*.nbc")
             for p in glob.glob(os.path.join(kernels, "__pycache__", pattern))]
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        for stem in stems:
            for ext in ("nbi", "nbc"):
                paths += glob.glob(os.path.join(user, "kernels_*", f"{stem}.*.{ext}"))
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass


def _held_elsewhere(lock: Any) -> bool:
    """True when another thread holds `lock` (an RLock its owner may re-enter)."""
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


def _after_fork_in_child() -> None:
    """A child forked while another thread was loading or compiling a kernel uses references.

    That thread does not exist in the child, yet the locks it held (this module's while the
    kernels are imported, numba's compiler lock while a kernel compiles or loads from the
    cache) stay held there for ever: any kernel load or compile in the child would wait on
    them. Such a child never touches the kernels. A child forked while other threads only
    run compiled kernels keeps them (serially, see [normlab.kernels._adapt][]), so its
    results are the parent's, bit for bit.
    """
    global _LOCK
    compiler = sys.modules.get("numba.core.compiler_lock")
    stuck = _held_elsewhere(_LOCK) or (
        compiler is not None and _held_elsewhere(compiler.global_compiler_lock._lock))
    if stuck:
        _LOCK = threading.RLock()
        _STATE["loaded"], _STATE["available"] = True, False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _import_kernels() -> None:
    """Import numba (through [normlab.kernels][]) and every kernel that `KERNELS` names."""
    importlib.import_module("normlab.kernels")  # ImportError here: no numba
    for name, target in KERNELS.items():
        module, function = target.split(":")
        _REGISTRY[name] = getattr(importlib.import_module(module), function)


def _load() -> bool:
    if _STATE["loaded"]:
        return bool(_STATE["available"])
    with _LOCK:
        if _STATE["loaded"]:
            return bool(_STATE["available"])
        try:
            _import_kernels()
            _STATE["available"] = True
        except Exception as exc:
            _STATE["available"] = _recover_import(exc)
        _STATE["loaded"] = True
        return bool(_STATE["available"])


def _recover_import(exc: BaseException) -> bool:
    """Retry a failed kernel import once with a temporary cache; False: references only."""
    _forget_kernels()
    if _is_cache_location_error(exc) and _move_cache_to_tmp():
        try:
            _import_kernels()
        except Exception as again:
            _forget_kernels()
            _warn_once(again, "Using the NumPy references.", _FIX_IMPORT)
            return False
        _warn_once(exc, f"Kernels cache to the temporary folder {os.environ['NUMBA_CACHE_DIR']}.")
        return True
    _warn_once(exc, "Using the NumPy references.", _FIX_IMPORT)
    return False


def kernel(name: str) -> Callable[..., Any] | None:
    """The compiled kernel registered for `name`, or None when the reference must run."""
    if backend() == "numpy" or name in _DISABLED:
        return None
    if not (_STATE["available"] if _STATE["loaded"] else _load()):  # no lock once loaded
        return None
    return _REGISTRY.get(name)


def kernels_compiled(timeout: float = 600.0) -> bool:
    """Wait (at most `timeout` seconds) until the helper process has compiled every
    multi-threaded kernel asked of it (`normlab.kernels._background`; the serial versions
    serve meanwhile); True when nothing is pending, at once when the kernels never loaded.
    Timings call it after their warm-up."""
    if not _STATE["available"]:
        return True
    return bool(importlib.import_module("normlab.kernels._background").wait(timeout))


def _generator_states(args: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    return [(a, a.bit_generator.state) for a in args if isinstance(a, np.random.Generator)]


def _restore(states: list[tuple[Any, Any]]) -> None:
    for gen, state in states:
        gen.bit_generator.state = state


def _retry_after(exc: BaseException) -> bool:
    """Mend what a cache fault broke (warning once); True when the kernel may be retried."""
    if isinstance(exc, _CORRUPT):
        _heal_cache()
        _warn_once(exc, "Deleted the kernels' cache files and compiled again.")
        return True
    if _is_cache_location_error(exc) and _move_cache_to_tmp():
        _warn_once(exc, "Kernels now cache to a temporary folder.")
        return True
    return False


def _call_kernel(name: str, fn: Callable[..., Any], ref: Callable[..., Any],
                 args: tuple[Any, ...]) -> Any:
    """fn(*args); on a kernel fault the reference's result (rules in the module header)."""
    states = _generator_states(args)
    try:
        return fn(*args)
    except MemoryError:  # the input is too large for this machine: not the kernel's fault
        _restore(states)
        raise
    except Exception as exc:
        _restore(states)
        fault: BaseException = exc
    # Does the reference serve these arguments? If it raises too, the arguments are at
    # fault: its exception reaches the caller and the kernel stays on.
    expected = ref(*args)
    after = _generator_states(args)
    if _retry_after(fault):
        _restore(states)
        try:
            return fn(*args)
        except MemoryError:
            _restore(states)
            raise
        except Exception as again:
            fault = again
        _restore(after)
    _DISABLED.add(name)
    fix = _FIX_CACHE if isinstance(fault, _CORRUPT) or _is_cache_location_error(fault) else (
        _FIX_KERNEL)
    _warn_once(fault, f"Using the NumPy reference for {name} from now on.", fix)
    return expected


def dispatch(name: str, ref: Callable[..., Any], *args: Any) -> Any:
    """Run the kernel registered under `name` when it serves `args`, else `ref(*args)`.

    `args` are the validated arguments of `ref`. NaN/inf inputs and float32 overflow
    produce NaN/inf in the affected rows without NumPy warnings, on both paths.

    Example
    -------
    >>> dispatch("no such op", lambda a: a + 1, 1)
    2
    """
    fn = kernel(name)
    # A row holding inf or NaN yields NaN in that row only (inf - inf inside the row), a huge
    # bfloat16 value may overflow float32 when squared, and 1/sqrt(0 + eps) may overflow for
    # a tiny eps: documented results, like PyTorch's, so NumPy's warnings are silenced.
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if fn is not None:
            result = _call_kernel(name, fn, ref, args)
            if result is not NotImplemented:
                return result
        return ref(*args)
