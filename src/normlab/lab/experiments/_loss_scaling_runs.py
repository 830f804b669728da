"""The training runs of `normlab.lab.experiments.loss_scaling`: sizes, data, one run, the
replicates, Figure 3's gradient sample and the back-off probe.

The experiment's module docstring states the set-up and why each setting was chosen; this
module holds the code that runs it. Dimension letters: B = batch, F = input features,
K = outputs per example.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from normlab.lab.experiments._loss_scaling_net import (
    FEATURES,
    HIDDEN,
    HIDDEN_LAYERS,
    DenseNet,
    init_record,
)
from normlab.lab.replicates import replicate_seeds
from normlab.lab.result import NullProgress, Progress, Settings
from normlab.lab.training import single_threaded
from normlab.nn.optim import AdamW
from normlab.precision import (
    FLOAT16,
    FLOAT32,
    DynamicLossScaler,
    MasterWeights,
    StaticLossScaler,
    mixed_precision_step,
)

__all__ = ["GROWTH_INTERVAL", "INIT_SCALE", "LR", "OUTPUT_SCALE", "PROBE_EXPONENT",
           "REPLICATES", "SNAPSHOTS", "backoff_probe", "data", "final_loss", "gradient_sample",
           "replicates", "sizes", "train"]

INIT_SCALE = 2.0**16
"""The dynamic loss scaler's first scale, 2^16 (PyTorch GradScaler's default)."""
OUTPUT_SCALE = 0.25
"""The fixed multiplier of the network's output (teacher and student): the loss gradient
reaching the head is OUTPUT_SCALE^2 = 1/16 of a unit-scale head's, as for a mean over 16x
more outputs (see the module docstring)."""
PROBE_EXPONENT = 40
"""The back-off probe's scale exponent: S = 2^40, far above where the gradients overflow."""
GROWTH_INTERVAL = 50
"""The dynamic scaler's growth interval: steps without overflow before it doubles."""
LR = 0.01  # Adam learning rate (all three runs): small enough for smooth trajectories
"""The Adam learning rate of all three runs: constant for two thirds of the steps, then
linearly to zero."""
REPLICATES = (4, 8, 12)
SNAPSHOTS = 10
"""Figure 3's histogram: every backward signal of this many evenly spaced fp32 steps."""
_TAIL = 0.1  # "final loss": geometric mean over the last tenth of the steps


def sizes(settings: Settings) -> dict[str, int]:
    b, k, steps = settings.pick((16, 4096, 400), (16, 8192, 400), (16, 65536, 500))
    return {"batch": b, "outputs": k, "steps": steps, "features": FEATURES, "hidden": HIDDEN,
            "hidden_layers": HIDDEN_LAYERS}


def data(settings: Settings) -> tuple[np.ndarray, np.ndarray, int]:
    sz = sizes(settings)
    rng = np.random.default_rng([settings.seed, 4])
    x = rng.standard_normal((sz["batch"], FEATURES)).astype(np.float32)  # B,F
    teacher = DenseNet(sz["outputs"], rng, OUTPUT_SCALE)  # the student's architecture
    y = teacher.forward(x).astype(np.float64)  # B,K
    return x, y, sz["outputs"]


def train(settings: Settings, mode: str, steps: int, progress: Progress,
           keep: list[np.ndarray] | None = None) -> dict[str, Any]:
    """Full-batch Adam in `mode` = "fp32", "fp16" (no scaling) or "fp16+scaler"."""
    x, y, k = data(settings)
    net = DenseNet(k, np.random.default_rng([settings.seed, 40]), OUTPUT_SCALE)
    init = init_record(net)  # what the student starts from, read off its arrays
    fp16 = mode != "fp32"
    master = MasterWeights(net.params, FLOAT16 if fp16 else FLOAT32)  # fp32 masters
    opt = AdamW(master.masters, lr=LR, weight_decay=0.0)
    scaler: DynamicLossScaler | StaticLossScaler = StaticLossScaler(1.0)
    if mode == "fp16+scaler":
        scaler = DynamicLossScaler(init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    losses, scales, skipped = [], [], 0
    for t in range(steps):
        opt.lr = LR * min(1.0, 3.0 * (1.0 - t / steps))  # constant, then to 0 over the last third
        scales.append(scaler.scale)
        sample = keep if keep is not None and t % (steps // SNAPSHOTS) == 0 else None
        losses.append(net.loss_and_grads(x, y, scaler.scale, fp16=fp16, keep=sample))
        # unscale, skip on overflow, step the fp32 masters, refresh the working copy
        skipped += mixed_precision_step(master, opt, scaler).skipped
        progress.advance()
    losses.append(net.loss_and_grads(x, y, 1.0, fp16=fp16))  # after the last step
    return {"loss": np.array(losses), "scale": np.array(scales), "skipped": skipped,
            "net": net, "optimizer": type(opt).__name__, "x": x, "y": y, "init": init}


def replicates(settings: Settings) -> list[Settings]:
    """The replicates' settings: the report's size, each with its own derived seed.

    Replicate k draws its data, teacher and student from `replicate_seeds(seed, n)[k]`
    ([normlab.lab.replicates.replicate_seeds][]); n = REPLICATES by size.
    """
    n = settings.pick(*REPLICATES)
    return [dataclasses.replace(settings, seed=int(q.generate_state(1)[0]))
            for q in replicate_seeds(settings.seed, n)]


def gradient_sample(settings: Settings, progress: Progress | None = None) -> np.ndarray:
    """Every backward signal of 10 evenly spaced steps of the fp32 run (as Figure 3), float32.

    Exact zeros (if any) included; the same values `measure` histograms: one BLAS
    thread, as `run` uses (the thread count changes the products' summation order, and
    with it a few of the values that underflow to zero).
    """
    keep: list[np.ndarray] = []
    with single_threaded():
        train(replicates(settings)[0], "fp32", sizes(settings)["steps"],
               progress or NullProgress(), keep)
    return np.concatenate(keep).astype(np.float32)


def backoff_probe(run: dict[str, Any]) -> dict[str, Any]:
    """One mixed-precision step of the scaled run's final network at S = 2^PROBE_EXPONENT,
    where its gradients overflow fp16: the step must be skipped, the weights kept and the
    scale halved. The training runs start at 2^16 and may never overflow; this step shows
    the back-off directly."""
    net, x, y = run["net"], run["x"], run["y"]
    master = MasterWeights(net.params, FLOAT16)
    opt = AdamW(master.masters, lr=LR, weight_decay=0.0)
    scaler = DynamicLossScaler(init_scale=2.0**PROBE_EXPONENT, growth_interval=GROWTH_INTERVAL)
    before = [p.data.copy() for p in net.params]
    net.loss_and_grads(x, y, scaler.scale, fp16=True)
    step = mixed_precision_step(master, opt, scaler)
    kept = all(np.array_equal(p.data, b) for p, b in zip(net.params, before, strict=True))
    for p, b in zip(net.params, before, strict=True):
        p.data = b  # whatever happened, the run's final weights stay as they were
    return {"skipped": bool(step.skipped), "kept": kept, "scale_after": float(scaler.scale)}


def final_loss(loss: np.ndarray) -> float:
    """The final loss, robust to Adam's step-to-step jitter: geometric mean of the last tenth."""
    tail = loss[-max(1, int(_TAIL * loss.size)):]
    return float(np.exp(np.mean(np.log(tail))))
