"""First-call compile time of the kernels, in fresh processes with an empty and a warm cache.

A child process imports normlab and calls LayerNorm, RMSNorm, BatchNorm and GroupNorm
forward + backward and `quantize` once, with `NUMBA_CACHE_DIR` pointing at a new empty
folder ("cold": every kernel compiles), then a second child with the same folder ("warm":
the machine code loads from disk, showing that a new process does not recompile).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

__all__ = ["compile_times"]

_SNIPPET = """
import time, numpy as np
t0 = time.perf_counter()
import normlab as nl
from normlab.precision import quantize
x = np.ones((4, 8), np.float32)
o, c = nl.layer_norm_forward(x, x[0], x[0]); nl.layer_norm_backward(x, c)
o, c = nl.rms_norm_forward(x, x[0]); nl.rms_norm_backward(x, c)
o, c = nl.batch_norm_forward(x, x[0], x[0], None, None, True); nl.batch_norm_backward(x, c)
g = np.ones((2, 4, 3), np.float32)
o, c = nl.group_norm_forward(g, 2, g[0, :, 0], g[0, :, 0]); nl.group_norm_backward(g, c)
quantize(x, "bf16")
print(time.perf_counter() - t0)
"""


def compile_times() -> dict[str, float]:
    """Seconds for import + first calls in a new process, cold then warm kernel cache.

    Returns
    -------
    times : dict
        `cold_cache_s` and `warm_cache_s`.
    """
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for label in ("cold_cache_s", "warm_cache_s"):
            proc = subprocess.run([sys.executable, "-c", _SNIPPET], env=env,
                                  capture_output=True, text=True, check=True)
            result[label] = float(proc.stdout.strip().splitlines()[-1])
    return result
