"""The one kernel-or-reference decision (normlab._backend.dispatch): failures fall back.

A kernel that raises is replaced by a stand-in (monkeypatched registry entry), so these
tests need no broken numba install; the process-level cases (read-only install, truncated
cache) are in test_processes.py. Expected values come from the NumPy references.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("numba")

import normlab as nl
from normlab import _backend
from normlab._backend import KernelFallbackWarning, use_backend


@pytest.fixture()
def registry(monkeypatch):
    """The kernel registry, with the fallback bookkeeping restored after the test."""
    assert _backend._load()
    monkeypatch.setattr(_backend, "_DISABLED", set())
    monkeypatch.setattr(_backend, "_WARNED", set())
    monkeypatch.setattr(_backend, "_heal_cache", lambda: None)
    return _backend._REGISTRY


def _reference(fn, *args, **kw):
    with use_backend("numpy"):
        return fn(*args, **kw)


def test_a_failing_kernel_warns_once_and_the_reference_answers(registry, monkeypatch):
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("kernel exploded")

    monkeypatch.setitem(registry, "layer_norm_forward", broken)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    with pytest.warns(KernelFallbackWarning, match="kernel exploded.*fault of normlab's kernel"
                      ) as seen:
        out, _ = nl.layer_norm_forward(x, None, None)
    assert "cache" not in str(seen[0].message)  # a kernel fault does not blame the cache
    out2, _ = nl.layer_norm_forward(x, None, None)  # disabled now: no call, no warning
    np.testing.assert_array_equal(out, _reference(nl.layer_norm_forward, x, None, None)[0])
    np.testing.assert_array_equal(out, out2)
    assert calls == [1]


def test_memory_error_reaches_the_caller_and_leaves_the_kernel_on(registry, monkeypatch):
    # an input too large for the machine is not a kernel fault: switching the kernel off
    # would change the bits every later call returns
    real, calls = registry["layer_norm_forward"], []

    def out_of_memory_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise MemoryError("cannot allocate 512 GiB")
        return real(*args)

    monkeypatch.setitem(registry, "layer_norm_forward", out_of_memory_once)
    x = np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(MemoryError, match="512 GiB"):
        nl.layer_norm_forward(x, None, None)
    assert "layer_norm_forward" not in _backend._DISABLED and not _backend._WARNED
    out, _ = nl.layer_norm_forward(x, None, None)  # the kernel again (warnings are errors)
    assert len(calls) == 2
    np.testing.assert_array_equal(out, real(*calls[1])[0])


def test_arguments_the_reference_rejects_too_are_not_a_kernel_fault(registry, monkeypatch):
    healed = []
    monkeypatch.setattr(_backend, "_heal_cache", lambda: healed.append(1))

    def kernel_rejects(a):
        raise ValueError("kernel: bad argument")

    def reference_rejects(a):
        raise ValueError(f"a must be positive; got {a}")

    monkeypatch.setitem(registry, "layer_norm_forward", kernel_rejects)
    with pytest.raises(ValueError, match="a must be positive; got -1"):
        _backend.dispatch("layer_norm_forward", reference_rejects, -1)
    assert "layer_norm_forward" not in _backend._DISABLED
    assert healed == [] and not _backend._WARNED  # no cache deleted, nothing blamed


def test_a_corrupted_cache_is_healed_and_the_kernel_retried(registry, monkeypatch):
    healed, real = [], registry["rms_norm_forward"]

    def truncated_once(*args):
        if not healed:
            raise pickle.UnpicklingError("pickle data was truncated")
        return real(*args)

    monkeypatch.setattr(_backend, "_heal_cache", lambda: healed.append(1))
    monkeypatch.setitem(registry, "rms_norm_forward", truncated_once)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    with pytest.warns(KernelFallbackWarning, match="truncated.*Deleted the kernels' cache"):
        out, _ = nl.rms_norm_forward(x, None)
    assert healed == [1] and "rms_norm_forward" not in _backend._DISABLED
    with use_backend("numba"):
        again, _ = nl.rms_norm_forward(x, None)
    np.testing.assert_array_equal(out, again)


def test_dropout_fallback_draws_the_same_numbers(registry, monkeypatch):
    real = registry["inverted_dropout"]

    def draws_then_fails(x, p, rng):
        real(x, p, rng)  # advances the generator, then the "kernel" dies
        raise OSError("cannot write cache")

    monkeypatch.setitem(registry, "inverted_dropout", draws_then_fails)
    x = np.ones((16, 16), np.float32)
    with pytest.warns(KernelFallbackWarning, match="cannot write cache"):
        out, keep = nl.inverted_dropout(x, 0.5, np.random.default_rng(3))
    ref, ref_keep = _reference(nl.inverted_dropout, x, 0.5, np.random.default_rng(3))
    np.testing.assert_array_equal(keep, ref_keep)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_nan_and_inf_rows_stay_in_their_row_without_warnings(backend):
    # warnings are errors in this suite: any NumPy RuntimeWarning fails the test
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x[0, 0, 0] = np.nan
    x[1, 2, 3] = np.inf
    with use_backend(backend):
        gn, _ = nl.group_norm_forward(x, 3, None, None)
        ln, _ = nl.layer_norm_forward(x, None, None)
    assert np.isnan(gn[0, 0]).all() and np.isfinite(gn[0, 1:]).all()
    assert np.isnan(gn[1, 2]).all() and np.isfinite(gn[1, :2]).all()
    assert np.isnan(ln[0, 0]).all() and np.isfinite(ln[0, 1:]).all()


def test_use_backend_applies_to_its_own_thread_only(monkeypatch):
    # a thread comparing against the references must not switch other threads' kernels
    import threading

    monkeypatch.delenv("NORMLAB_BACKEND", raising=False)
    inside, done = threading.Event(), threading.Event()
    seen: list[str] = []

    def compare():
        with use_backend("numpy"):
            seen.append(_backend.backend())
            inside.set()
            done.wait(10)

    t = threading.Thread(target=compare)
    t.start()
    assert inside.wait(10)
    try:
        here = _backend.backend()
    finally:
        done.set()
        t.join(10)
    assert (seen, here, _backend.backend()) == (["numpy"], "numba", "numba")


def test_healing_deletes_only_normlab_files_from_a_shared_numba_cache(tmp_path, monkeypatch):
    # NUMBA_CACHE_DIR may hold other projects' kernels: a corrupted normlab cache must not
    # cost them theirs
    ours = tmp_path / "kernels_0123abcd" / "row_norms_jit.layer_norm_fwd-40.py311.nbi"
    theirs = [tmp_path / "models_4567ef" / "train.step-12.py311.nbi",
              tmp_path / "models_4567ef" / "train.step-12.py311.1.nbc",
              tmp_path / "kernels_89ab" / "my_op.f-3.py311.nbi"]
    for path in [ours, *theirs]:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    _backend._heal_cache()
    assert not ours.exists()
    assert all(p.exists() for p in theirs)
