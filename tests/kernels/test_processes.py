"""Process-level reliability of the kernels: fork, threads, read-only installs, bad caches.

Every case runs a script in a subprocess with a timeout, so a hang or an abort (the
failures these tests guard against: GNU OpenMP aborting a forked child, the workqueue
layer aborting on concurrent threads, numba refusing to cache or to load a truncated cache)
fails the test instead of hanging or killing the suite. Scripts print one line of JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

SRC = Path(__file__).resolve().parents[2] / "src"

# Every public kernel-backed op on float32 inputs large enough for the parallel path
# (512 * 512 > 2^17 values); returns a list of arrays.
_OPS = """
import numpy as np, normlab as nl

def every_op(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((512, 512)).astype(np.float32)
    dy = rng.standard_normal((512, 512)).astype(np.float32)
    g = rng.standard_normal(512).astype(np.float32)
    o, c = nl.layer_norm_forward(x, g, g); r = [o, *nl.layer_norm_backward(dy, c)]
    o, c = nl.rms_norm_forward(x, g); r += [o, *nl.rms_norm_backward(dy, c)]
    o, s, c = nl.add_layer_norm_forward(x, dy, g, g)
    r += [o, s, *nl.add_layer_norm_backward(dy, dy, c)]
    o, s, c = nl.add_rms_norm_forward(x, dy, g); r += [o, s, *nl.add_rms_norm_backward(dy, None, c)]
    rm, rv = np.zeros(512, np.float32), np.ones(512, np.float32)
    o, c = nl.batch_norm_forward(x, g, g, rm, rv, True)
    r += [o, rm, rv, *nl.batch_norm_backward(dy, c)]
    o, c = nl.batch_norm_forward(x, g, g, None, None, True, out=np.empty_like(x))  # in place
    d = dy.copy(); r += [o, *nl.batch_norm_backward(d, c, out=(d, np.empty_like(g), None))]
    x4 = x.reshape(8, 64, 32, 16)
    o, c = nl.group_norm_forward(x4, 8, None, None); r += [o, nl.group_norm_backward(x4, c)[0]]
    o, c = nl.group_norm_forward(x4, 8, g[:64], g[:64]); r += [o, *nl.group_norm_backward(x4, c)]
    o, c = nl.group_norm_forward(x, 32, g, g); r += [o, *nl.group_norm_backward(dy, c)]  # 2-D
    r += list(nl.inverted_dropout(x, 0.25, np.random.default_rng(1)))
    r += [nl.precision.quantize(x, f) for f in ("bf16", "e4m3", "e5m2")]
    r.append(nl.precision.quantize(x, "e4m3", rounding="stochastic", rng=np.random.default_rng(2)))
    return [a for a in r if a is not None]

def digest(arrays):
    import hashlib
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
"""


def _run(script: str, *, timeout: float, env: dict[str, str | None] | None = None,
         prefix: list[str] | None = None, path: Path = SRC) -> dict:
    """Run ``script`` in a fresh interpreter (``env`` values of None are unset) and return
    the JSON of its last stdout line."""
    full_env = {**os.environ, "PYTHONPATH": str(path), "PYTHONWARNINGS": "error"}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    code = _OPS + textwrap.dedent(script)
    try:
        proc = subprocess.run([*(prefix or []), sys.executable, "-c", code], env=full_env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script hung for {timeout} s: {exc.stderr!r}"[-2000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_forked_children_compute_what_the_parent_computed():
    # the parent runs the parallel kernels, then forks in every way Python offers
    pytest.importorskip("torch")  # one of the ways is a PyTorch DataLoader's workers
    got = _run("""
        import json, os, multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        import torch
        from normlab.kernels import _adapt
        want = digest(every_op())
        assert _adapt._STATE["parallel_ran"]
        _adapt.PARALLEL_MIN_ELEMENTS = 1 << 62  # compile the serial twins once, here
        assert digest(every_op()) == want
        _adapt.PARALLEL_MIN_ELEMENTS = 1 << 17
        def job(seed):
            return digest(every_op(seed))
        pid = os.fork()
        if pid == 0:
            os._exit(0 if job(0) == want else 3)
        status = os.waitpid(pid, 0)[1]
        with mp.get_context("fork").Pool(2) as pool:
            pooled = pool.map(job, [0, 0, 0])
        with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
            executed = list(ex.map(job, [0, 0]))
        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                x = np.full((64, 512), i + 0.1, np.float32)
                return nl.precision.quantize(nl.layer_norm_forward(x, None, None)[0], "e4m3")
        loader = torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=2,
                                             multiprocessing_context="fork")
        epochs = [[b.numpy().tobytes() for b in loader] for _ in range(2)]
        direct = [np.stack([Data()[i], Data()[i + 1]]).tobytes() for i in (0, 2)]
        print(json.dumps({"fork": os.waitstatus_to_exitcode(status),
                          "pool": [d == want for d in pooled],
                          "executor": [d == want for d in executed],
                          "loader": [e == direct for e in epochs]}))
    """, timeout=150)
    assert got == {"fork": 0, "pool": [True] * 3, "executor": [True] * 2,
                   "loader": [True, True]}


_THREADS = """
    import json, threading, numba
    serial = digest(every_op())
    results = []
    def worker():
        for _ in range(2):
            results.append(digest(every_op()))
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"layer": numba.threading_layer(), "same": [r == serial for r in results]}))
"""


@pytest.mark.parametrize("layer", ["workqueue", "omp"])
def test_eight_threads_get_the_serial_results_on_every_layer(layer):
    got = _run(_THREADS, timeout=150, env={"NUMBA_THREADING_LAYER": layer})
    assert got == {"layer": layer, "same": [True] * 16}


def _copy_package(root: Path) -> Path:
    """A fresh copy of the normlab package under root (no compiled cache)."""
    dest = root / "site"
    shutil.copytree(SRC / "normlab", dest / "normlab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# One small LayerNorm (the serial kernel only: a cold compile stays short), then the
# reference; the kernel result must match it.
_CHECK = """
    import json, warnings
    from normlab._backend import use_backend
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = nl.layer_norm_forward(x, None, None)[0]
    with use_backend("numpy"):
        ref = nl.layer_norm_forward(x, None, None)[0]
    print(json.dumps({"warnings": [(w.category.__name__, str(w.message)) for w in caught],
                      "close": bool(np.allclose(got, ref, rtol=1e-5, atol=1e-5)),
                      "digest": digest([got])}))
"""


def test_read_only_install_without_a_writable_home_warns_once_and_computes():
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to drop root's file-permission override")
    root = Path(tempfile.mkdtemp())
    try:
        site = _copy_package(root)
        home = root / "home"
        home.mkdir()
        for p in [root, *root.rglob("*")]:  # read-only for everyone, like a system install
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        # uid 0 without capabilities obeys file permissions like an unprivileged user
        env: dict[str, str | None] = {
            "HOME": str(home), "XDG_CACHE_HOME": None, "NUMBA_CACHE_DIR": None}
        got = _run(_CHECK, timeout=150, env=env, path=site,
                   prefix=["setpriv", "--bounding-set=-all", "--inh-caps=-all"])
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
        shutil.rmtree(root)
    assert got["close"]
    assert len(got["warnings"]) == 1, got["warnings"]
    category, message = got["warnings"][0]
    assert category == "KernelFallbackWarning"
    assert "cannot cache" in message and "NUMBA_CACHE_DIR" in message
    # the kernels recovered through a temporary cache, not by falling back to the references
    assert "temporary folder" in message
    # ... which the process removed when it exited
    folder = re.search(r"temporary folder (\S+?)\. ", message)
    assert folder is not None, message
    assert not Path(folder.group(1)).exists()


def test_a_truncated_cache_file_heals_itself():
    root = Path(tempfile.mkdtemp())
    try:
        site = _copy_package(root)
        first = _run(_CHECK, timeout=150, path=site, env={"NUMBA_CACHE_DIR": None})
        assert first["warnings"] == [] and first["close"]
        cache = site / "normlab" / "kernels" / "__pycache__"
        index = sorted(cache.glob("row_norms_jit.layer_norm_fwd_serial-*.nbi"))
        data = sorted(cache.glob("row_norms_jit.layer_norm_fwd_serial-*.nbc"))
        assert index and data, sorted(p.name for p in cache.iterdir())
        for p in (index[0], data[0]):
            p.write_bytes(p.read_bytes()[:7])  # truncated mid-pickle
        second = _run(_CHECK, timeout=150, path=site, env={"NUMBA_CACHE_DIR": None})
        third = _run(_CHECK, timeout=150, path=site, env={"NUMBA_CACHE_DIR": None})
    finally:
        shutil.rmtree(root)
    assert second["close"] and second["digest"] == first["digest"]
    assert [w[0] for w in second["warnings"]] == ["KernelFallbackWarning"]
    assert "Deleted the kernels' cache files" in second["warnings"][0][1]
    assert third["warnings"] == [] and third["digest"] == first["digest"]  # healed


def test_a_child_forked_while_another_thread_is_in_a_kernel_does_not_hang():
    # A thread loading the kernels (the first call) or compiling one (a new dtype holds
    # numba's compiler lock) when another thread forks: the child must still compute (it
    # falls back to the references). Threads that only run compiled kernels while another
    # forks: the child keeps the kernels and computes the parent's bits.
    got = _run("""
        import json, os, threading, time
        from numba.core.compiler_lock import global_compiler_lock
        from normlab import _backend
        x = np.random.default_rng(0).standard_normal((8, 64))
        with _backend.use_backend("numpy"):
            want = nl.layer_norm_forward(x, None, None)[0]
        def child_status():
            pid = os.fork()
            if pid == 0:
                for dt in (np.float32, np.float64):
                    got = nl.layer_norm_forward(x.astype(dt), None, None)[0]
                    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                        os._exit(3)
                os._exit(0)
            for _ in range(200):  # 20 s
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return os.waitstatus_to_exitcode(status)
                time.sleep(0.1)
            os.kill(pid, 9); os.waitpid(pid, 0)
            return "hung"
        inside = threading.Event()
        real_import = _backend._import_kernels
        def slow_import():
            inside.set(); time.sleep(1.0); real_import()
        _backend._import_kernels = slow_import
        t = threading.Thread(target=nl.layer_norm_forward, args=(x[:, :8].astype(np.float32),
                                                                 None, None))
        t.start(); inside.wait(); loading = child_status(); t.join()
        _backend._import_kernels = real_import
        inside.clear()
        real = _backend._REGISTRY["layer_norm_forward"]
        def compiling(*args):
            with global_compiler_lock:  # what a first call with a new dtype holds
                inside.set(); time.sleep(1.0)
            return real(*args)
        _backend._REGISTRY["layer_norm_forward"] = compiling
        t = threading.Thread(target=nl.layer_norm_forward, args=(x[:2].astype(np.float32),
                                                                 None, None))
        t.start(); inside.wait(); calling = child_status(); t.join()
        _backend._REGISTRY["layer_norm_forward"] = real
        # threads only running compiled kernels: a child keeps the kernels, bit for bit
        want = digest(every_op())
        stop = threading.Event()
        def loop():
            while not stop.is_set():
                every_op()
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads: t.start()
        running = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                os._exit(0 if digest(every_op()) == want else 3)
            running.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        stop.set()
        for t in threads: t.join()
        print(json.dumps({"loading": loading, "calling": calling, "running": running}))
    """, timeout=120)
    assert got == {"loading": 0, "calling": 0, "running": [0, 0, 0]}
