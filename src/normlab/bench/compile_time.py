"""First-call compile time of the kernels, in fresh processes with an empty and a warm cache.

A child process imports normlab and calls LayerNorm, RMSNorm, BatchNorm and GroupNorm
forward + backward and `quantize` once, with `NUMBA_CACHE_DIR` pointing at a new empty
folder ("cold": every kernel compiles), then a second child with the same folder ("warm":
the machine code loads from disk, showing that a new process does not recompile).

[torch_cold_start][normlab.bench.compile_time.torch_cold_start] does the same for the
first training step of a converted model, one recipe at a time (a fresh install: the
kernels that recipe's operands use compile during its first forward and backward). Its
check: the warm child computes the cold child's loss and gradient norm bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

__all__ = ["TORCH_RECIPES", "compile_times", "format_cold_start", "torch_cold_start"]

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


TORCH_RECIPES = ("Bf16Recipe", "Fp8DelayedRecipe", "Fp8CurrentRecipe", "MXRecipe",
                 "NVFP4Recipe", "BlockwiseFp8Recipe")
"""The recipes (class names in `normlab.torch`) whose first training step is timed."""

_TORCH_SNIPPET = """
import sys, time
t0 = time.perf_counter()
import torch
import normlab.torch as nt
t1 = time.perf_counter()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
model = nt.convert(net, getattr(nt, sys.argv[1])())
x = torch.randn(64, 256)
t2 = time.perf_counter()
loss = model(x).square().mean()
loss.backward()
t3 = time.perf_counter()
grad = sum(float(p.grad.double().square().sum()) for p in model.parameters())
print(t1 - t0, t3 - t2, float(loss.detach()).hex(), grad.hex())
"""


def torch_cold_start(recipes: tuple[str, ...] = TORCH_RECIPES) -> dict[str, dict[str, object]]:
    """Seconds of the first forward + backward of a converted MLP in a fresh process.

    For each recipe a child process with an empty `NUMBA_CACHE_DIR` (a fresh install)
    imports torch and `normlab.torch`, converts a 256-512-256 MLP and times its first
    forward and backward on 64 rows; a second child with the same cache repeats it
    (warm). Layers this small run the single-threaded kernels; layers of 2^17 elements
    or more also compile the multi-threaded version of each kernel they use.

    Parameters
    ----------
    recipes : tuple of str, optional
        Class names of `normlab.torch` recipes (default all six, `TORCH_RECIPES`).

    Returns
    -------
    times : dict
        Recipe name -> `{"cold_s", "warm_s", "import_s", "same_result"}`: the first
        step's seconds with an empty and a warm cache, the cold child's import time, and
        whether both children computed the same loss and gradient norm bit for bit.
    """
    out: dict[str, dict[str, object]] = {}
    for name in recipes:
        with tempfile.TemporaryDirectory() as cache_dir:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
            runs = [subprocess.run([sys.executable, "-c", _TORCH_SNIPPET, name], env=env,
                                   capture_output=True, text=True, check=True
                                   ).stdout.split() for _ in range(2)]
        (imp, cold, *cold_result), (_, warm, *warm_result) = runs
        out[name] = {"cold_s": float(cold), "warm_s": float(warm), "import_s": float(imp),
                     "same_result": cold_result == warm_result}
    return out


def format_cold_start(times: dict[str, dict[str, object]]) -> str:
    """The lines `normlab bench` prints for
    [torch_cold_start][normlab.bench.compile_time.torch_cold_start]'s result."""
    lines = ["first forward + backward of a converted 256-512-256 MLP in a new process "
             "(kernel compilation on a fresh install; import of torch + normlab.torch not "
             "included):"]
    for name, t in times.items():
        check = "ok" if t["same_result"] else "FAILED (warm result differs)"
        lines.append(f"  {name:<20} empty cache {t['cold_s']:6.2f} s, warm cache "
                     f"{t['warm_s']:5.2f} s, check {check}")
    return "\n".join(lines)
