"""Multi-threaded kernels compiled by the helper process while the serial versions serve.

Each scenario runs in a new process with an empty `NUMBA_CACHE_DIR` (a fresh install) and
the helper switched on (the suite itself runs with it off, see conftest.py): the first call
on a large input must not compile the multi-threaded version in the calling process, the
helper must put it in the disk cache, the next call must load it from there, and every
result must be the same bits as the serial version's.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

from normlab.kernels import _adapt, _background, operand_jit

pytest.importorskip("numba")

_PRELUDE = """
import json, sys, time
import numpy as np
from normlab.precision import quantize
from normlab.kernels import _background

x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)  # 2^18: parallel
ref = quantize(x, "bf16")  # the first call
jobs = dict(_background._JOBS)
kernels = [_background.locate(locator) for locator, _ in jobs]
compiled_here = sum(len(k.parallel.overloads) for k in kernels)
"""


def _run(body: str, tmp_path, timeout: float = 240) -> dict:
    env = dict(os.environ, NORMLAB_BACKGROUND_COMPILE="1", NUMBA_CACHE_DIR=str(tmp_path))
    code = _PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_helper_compiles_into_the_cache_and_the_next_call_loads_it(tmp_path):
    out = _run("""
        from normlab._backend import kernels_compiled
        ready = kernels_compiled(180)  # what timings call after their warm-up
        again = quantize(x, "bf16")
        print(json.dumps({
            "requested": len(jobs), "compiled_here": compiled_here, "ready": ready,
            "states": list(_background._JOBS.values()),
            "loaded": sum(sum(k.parallel._cache_hits.values()) for k in kernels),
            "overloads": sum(len(k.parallel.overloads) for k in kernels),
            "same": again.tobytes() == ref.tobytes()}))
    """, tmp_path)
    assert out["requested"] >= 1  # the first call asked the helper ...
    assert out["compiled_here"] == 0  # ... and did not compile the parallel version here
    assert out["ready"] and set(out["states"]) == {"done"}
    assert out["loaded"] == out["overloads"] >= 1  # the next call loaded the helper's work
    assert out["same"]  # serial first, parallel next: the same bits
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*"))


def test_a_helper_that_dies_leaves_the_compilation_to_this_process(tmp_path):
    out = _run("""
        _background._WORKER["proc"].kill()
        deadline = time.time() + 60
        while _background.pending() and time.time() < deadline:
            time.sleep(0.05)
        again = quantize(x, "bf16")
        print(json.dumps({
            "states": list(_background._JOBS.values()),
            "overloads": sum(len(k.parallel.overloads) for k in kernels),
            "same": again.tobytes() == ref.tobytes()}))
    """, tmp_path)
    assert set(out["states"]) == {"failed"}
    assert out["overloads"] >= 1  # compiled here on the next call
    assert out["same"]


def test_no_helper_at_all_compiles_here_on_the_first_call(tmp_path):
    env = dict(os.environ, NORMLAB_BACKGROUND_COMPILE="1", NUMBA_CACHE_DIR=str(tmp_path))
    code = ("import sys; sys.executable = '/nonexistent/python'\n" + _PRELUDE
            + "print(json.dumps({'states': list(jobs.values()), 'here': compiled_here}))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out["states"]) == {"failed"}
    assert out["here"] >= 1


def test_the_helper_is_on_unless_the_environment_turns_it_off(monkeypatch):
    monkeypatch.delenv("NORMLAB_BACKGROUND_COMPILE")  # this suite sets 0 (conftest.py)
    assert _background.enabled()
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv("NORMLAB_BACKGROUND_COMPILE", off)
        assert not _background.enabled(), off
    monkeypatch.setenv("NORMLAB_BACKGROUND_COMPILE", "1")
    assert _background.enabled()


def _dual_kernels():
    import normlab.kernels

    for info in pkgutil.iter_modules(normlab.kernels.__path__):  # every kernel module
        module = importlib.import_module(f"normlab.kernels.{info.name}")
        for value in vars(module).values():
            if isinstance(value, _adapt.DualKernel):
                yield value
    for run in (0, 16, 32, 128):
        for stochastic in (False, True):
            yield operand_jit._fake_blocks_kernel(run, stochastic)


def test_the_helper_finds_every_kernel_by_its_locator():
    kernels = list(_dual_kernels())
    assert len(kernels) > 30
    for kern in kernels:
        assert _background.locate(kern._deferring.locator) is kern, kern.__name__


def test_the_locator_of_a_kernel_that_cannot_be_found_fails_loudly():
    with pytest.raises(AttributeError):
        _background.locate(("normlab.kernels.quantize_jit", "no_such_kernel", None))


def test_exit_with_the_helper_busy_is_quiet_and_leaves_no_process(tmp_path):
    """A process that ends while the helper compiles (or waits for work) stops it (no
    leftover process) and says nothing, even with every warning an error (unclosed pipes,
    a running child)."""
    env = dict(os.environ, NORMLAB_BACKGROUND_COMPILE="1", NUMBA_CACHE_DIR=str(tmp_path))
    code = _PRELUDE + "print(_background._WORKER['proc'].pid, _background.pending())"
    proc = subprocess.run([sys.executable, "-X", "dev", "-W", "error", "-c", code], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    pid, pending = map(int, proc.stdout.split())
    assert pending in (0, 1)  # 1: still compiling when the process ended (the usual case)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
