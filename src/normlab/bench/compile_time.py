"""First-call compile time of the kernels, in fresh processes with an empty and a warm cache.

A child process imports normlab and calls LayerNorm, RMSNorm, BatchNorm and GroupNorm
forward + backward and `quantize` once, with `NUMBA_CACHE_DIR` pointing at a new empty
folder ("cold": every kernel compiles), then a second child with the same folder ("warm":
the machine code loads from disk, showing that a new process does not recompile).

[torch_cold_start][normlab.bench.compile_time.torch_cold_start] does the same for the
first training step of a converted model, one recipe at a time (a fresh install: the
kernels that recipe's operands use compile during its first forward and backward), with
the background compile helper on and off. Its check: every child computes the same loss
and gradient norm bit for bit.
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
from normlab.kernels import _background
t1 = time.perf_counter()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
model = nt.convert(net, getattr(nt, sys.argv[1])())
x = torch.randn(64, 256)
t2 = time.perf_counter()
loss = model(x).square().mean()
loss.backward()
t3 = time.perf_counter()
while _background.pending() and time.perf_counter() - t3 < 600:
    time.sleep(0.01)
t4 = time.perf_counter()
grad = sum(float(p.grad.double().square().sum()) for p in model.parameters())
print(t1 - t0, t3 - t2, t4 - t2, float(loss.detach()).hex(), grad.hex())
"""

_CHILDREN = (("cold", "1"), ("inline", "0"), ("warm", "1"))  # (label, background compile)


def torch_cold_start(recipes: tuple[str, ...] = TORCH_RECIPES) -> dict[str, dict[str, object]]:
    """Seconds of the first forward + backward of a converted MLP in a fresh process.

    For each recipe a child process with an empty `NUMBA_CACHE_DIR` (a fresh install)
    imports torch and `normlab.torch`, converts a 256-512-256 MLP and times its first
    forward and backward on 64 rows, then waits until the helper process has compiled the
    multi-threaded kernels its layers of 2^17 values asked for (the serial versions serve
    meanwhile, see `normlab.kernels._adapt`). A second child with another empty cache does
    the same with the helper off (`NORMLAB_BACKGROUND_COMPILE=0`: every kernel compiles
    in the calling process, as before the helper), and a third child reuses the first
    one's cache (warm).

    Parameters
    ----------
    recipes : tuple of str, optional
        Class names of `normlab.torch` recipes (default all six, `TORCH_RECIPES`).

    Returns
    -------
    times : dict
        Recipe name -> `{"cold_s", "helper_s", "inline_s", "warm_s", "import_s",
        "same_result"}`: the first step's seconds with an empty cache, the seconds from
        its start until the helper was done, the first step's seconds with an empty cache
        and the helper off, the first step's seconds with a warm cache, the cold child's
        import time, and whether all three children computed the same loss and gradient
        norm bit for bit.
    """
    out: dict[str, dict[str, object]] = {}
    for name in recipes:
        runs = {}
        with tempfile.TemporaryDirectory() as cold_dir, tempfile.TemporaryDirectory() as other:
            for label, background in _CHILDREN:
                cache = other if label == "inline" else cold_dir
                env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                           NORMLAB_BACKGROUND_COMPILE=background)
                runs[label] = subprocess.run(
                    [sys.executable, "-c", _TORCH_SNIPPET, name], env=env,
                    capture_output=True, text=True, check=True).stdout.split()
        results = {tuple(run[3:]) for run in runs.values()}
        out[name] = {"cold_s": float(runs["cold"][1]), "helper_s": float(runs["cold"][2]),
                     "inline_s": float(runs["inline"][1]), "warm_s": float(runs["warm"][1]),
                     "import_s": float(runs["cold"][0]), "same_result": len(results) == 1}
    return out


def format_cold_start(times: dict[str, dict[str, object]]) -> str:
    """The lines `normlab bench` prints for
    [torch_cold_start][normlab.bench.compile_time.torch_cold_start]'s result."""
    lines = ["first forward + backward of a converted 256-512-256 MLP in a new process "
             "(kernel compilation on a fresh install; import of torch + normlab.torch not "
             "included); multi-threaded kernels ready: when the helper process had "
             "compiled them; helper off: every kernel compiled in the calling process:"]
    for name, t in times.items():
        check = "ok" if t["same_result"] else "FAILED (results differ)"
        lines.append(f"  {name:<20} empty cache {t['cold_s']:6.2f} s (multi-threaded "
                     f"kernels ready at {t['helper_s']:6.2f} s; helper off "
                     f"{t['inline_s']:6.2f} s), warm cache {t['warm_s']:5.2f} s, "
                     f"check {check}")
    return "\n".join(lines)
