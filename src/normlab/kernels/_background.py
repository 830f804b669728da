"""Multi-threaded kernels compiled in a helper process while the serial ones serve.

Every kernel has a serial and a multi-threaded (`parallel=True`) version of the same
source (see [normlab.kernels._adapt][]), and the two compute the same bits. The
multi-threaded version takes two to four times as long to compile (numba's parfor
passes), and on a fresh install a converted model's first training step waited for both:
13 s for MXFP8 on 2 cores, half of it for versions that only speed up layers of 2^17
values or more.

So the first call of a multi-threaded version whose signature is neither compiled in this
process nor in numba's disk cache does not compile it here. It asks one helper process
(started on that first request, `python -c` with this interpreter and this `sys.path`) to
compile it into the disk cache, and runs the serial version meanwhile. When the helper
reports the kernel done, the next call loads it from the cache (milliseconds) and runs on
every core. The results are the same bits either way; only the first calls of a large layer
run on one core. A signature the helper could not cache (an unwritable cache folder, a
failed start) compiles in this process on its next call, as before.

`NORMLAB_BACKGROUND_COMPILE=0` (read at each request) compiles in this process instead:
the test suite sets it, so that its multi-threaded checks run the multi-threaded code. The
helper exits when this process exits (it is killed then: numba writes its cache files
atomically, so an interrupted compilation leaves nothing half-written) or when it finishes
its queue after this process closed its input.
"""

from __future__ import annotations

import atexit
import base64
import importlib
import os
import pickle
import subprocess
import sys
import threading
from typing import Any

__all__ = ["Locator", "NotCompiledYet", "defer_compilation", "enabled", "locate", "pending",
           "shutdown", "wait", "worker"]

_ENV = "NORMLAB_BACKGROUND_COMPILE"
Locator = tuple[str, str, "tuple[Any, ...] | None"]  # (module, attribute, factory arguments)


class NotCompiledYet(Exception):
    """The multi-threaded version is being compiled in the helper: run the serial one."""


# job key -> "pending" | "done" | "failed"; one helper process per parent process
_JOBS: dict[tuple[Any, ...], str] = {}
_WORKER: dict[str, Any] = {"proc": None, "tokens": {}, "reader": None}
_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether a missing multi-threaded kernel is compiled in the helper (the default)."""
    return os.environ.get(_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def pending() -> int:
    """How many requested kernels the helper has not finished yet."""
    return sum(state == "pending" for state in _JOBS.values())


def wait(timeout: float = 600.0) -> bool:
    """Block until the helper has finished every requested kernel (at most `timeout`
    seconds); True when nothing is pending. Timings call it after their warm-up, so that
    they time the multi-threaded versions, not the serial ones that serve meanwhile."""
    import time

    deadline = time.monotonic() + timeout
    while pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not pending()


def _after_fork_in_child() -> None:
    # the parent's helper and its pipes are not this process's
    _JOBS.clear()
    _WORKER.update(proc=None, tokens={}, reader=None)


os.register_at_fork(after_in_child=_after_fork_in_child)


_WORKER_CODE = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from normlab.kernels._background import worker; worker()"
)


def _start() -> Any:
    import json

    env = dict(os.environ, **{_ENV: "0"})
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER_CODE, json.dumps(sys.path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, text=True, bufsize=1,
    )
    tokens: dict[str, tuple[Any, ...]] = {}
    reader = threading.Thread(target=_read_replies, args=(proc, tokens), daemon=True,
                              name="normlab-compile-replies")
    _WORKER.update(proc=proc, tokens=tokens, reader=reader)
    reader.start()
    return proc


def _read_replies(proc: Any, tokens: dict[str, tuple[Any, ...]]) -> None:
    try:
        for line in proc.stdout:
            word, _, token = line.strip().partition(" ")
            if token in tokens:
                _JOBS[tokens[token]] = "done" if word == "done" else "failed"
    finally:  # the helper is gone: what it did not finish compiles in this process
        for key in list(tokens.values()):
            if _JOBS.get(key) == "pending":
                _JOBS[key] = "failed"
        proc.stdout.close()


def shutdown() -> None:
    """Stop the helper now (at exit; numba's cache writes are atomic)."""
    proc = _WORKER["proc"]
    if proc is None:
        return
    _WORKER["proc"] = None
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    try:
        proc.stdin.close()
    except OSError:  # the pipe to the killed helper is broken
        pass
    _WORKER["reader"].join(timeout=1.0)  # it reads the end of the pipe and closes it


atexit.register(shutdown)


def _request(locator: Locator, args: tuple[Any, ...]) -> str:
    """The state of the helper's job for (kernel, argument types); start it if new."""
    key = (locator, args)
    with _LOCK:
        state = _JOBS.get(key)
        if state is not None:
            return state
        proc = _WORKER["proc"]
        try:
            if proc is None or proc.poll() is not None:
                proc = _start()
            token = str(len(_WORKER["tokens"]))
            module_file = importlib.import_module(locator[0]).__file__
            payload = pickle.dumps((locator, module_file, args))
            _WORKER["tokens"][token] = key
            _JOBS[key] = "pending"
            proc.stdin.write(f"{token} {base64.b64encode(payload).decode()}\n")
            proc.stdin.flush()
        except (OSError, ValueError, pickle.PicklingError):  # no helper: compile here
            _JOBS[key] = "failed"
        return _JOBS[key]


class _DeferringCompiler:
    """Stands in for a dispatcher's compiler: asks the helper instead of compiling.

    numba's `Dispatcher.compile` looks in this process's overloads and in the disk cache
    first, and calls the compiler only when both miss; only that step is deferred.
    """

    def __init__(self, compiler: Any, locator: Locator) -> None:
        self._compiler = compiler
        self.locator = locator

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiler, name)

    def compile(self, args: Any, return_type: Any) -> Any:
        if enabled() and _request(self.locator, tuple(args)) == "pending":
            raise NotCompiledYet(self.locator)
        return self._compiler.compile(args, return_type)


def defer_compilation(dispatcher: Any, locator: Locator) -> _DeferringCompiler:
    """Route `dispatcher`'s compilations of new signatures through the helper.

    `locator` = (module, attribute, factory arguments or None) finds the same kernel in the
    helper: `getattr(module, attribute)`, called with the arguments when they are given.
    Returns the stand-in, whose `locator` a factory of kernels sets to its own.
    """
    deferring = _DeferringCompiler(dispatcher._compiler, locator)
    dispatcher._compiler = deferring
    return deferring


def locate(locator: Locator) -> Any:
    """The kernel `locator` names (what the helper compiles)."""
    module, name, factory_args = locator
    kernel = getattr(importlib.import_module(module), name)
    return kernel if factory_args is None else kernel(*factory_args)


def worker() -> None:
    """The helper's loop: compile each requested kernel into the disk cache, say so."""
    for line in sys.stdin:
        token, _, payload = line.strip().partition(" ")
        try:
            locator, module_file, args = pickle.loads(base64.b64decode(payload))
            if importlib.import_module(locator[0]).__file__ != module_file:
                raise ImportError("the helper imports another copy of normlab")
            locate(locator).parallel.compile(args)
            reply = "done"
        except Exception:  # reported: the parent compiles it itself
            reply = "failed"
        sys.stdout.write(f"{reply} {token}\n")
        sys.stdout.flush()
