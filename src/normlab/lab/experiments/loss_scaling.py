"""Experiment 4: fp16 gradients, the range they fall in, and loss scaling.

Micikevicius et al. 2017 ("Mixed Precision Training", section 3.2 and Figure 3): part of
the activation gradients seen during training lie below fp16's smallest subnormal (2^-24)
and flush to zero, while most of fp16's range above them is left unused; multiplying the
loss by a scale S shifts every gradient up by log2(S) binades, which saves them as long as
the largest one stays below fp16's max (65504); a dynamic scaler finds S by backing off on
overflow and growing after a run of clean steps.

Setup: a deep narrow ReLU MLP (weights N(0, 1/fan_in), half the He variance, so the
backward signal shrinks by about sqrt(2) per layer, as in a network that is not perfectly
initialised) regressing a random teacher with the mean squared error over the batch. No
factor is put on the loss: the gradients are small because the error is averaged over the
batch, shrinks as training converges, and fades through the layers. As in the paper's
Figure 3, the histogram collects every backward signal seen during the fp32 run. The fp16
runs round weights, activations and every backward signal to fp16 and keep fp32 master
weights: ``MasterWeights`` and ``mixed_precision_step`` (unscale, skip on overflow, step,
refresh) from :mod:`normlab.precision`, with a ``StaticLossScaler(1)`` or a
``DynamicLossScaler``. Dimension letters: B = batch, F = input features, H = hidden width.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.experiments._loss_scaling_figures import (
    plot_flush,
    plot_histogram,
    plot_training,
)
from normlab.lab.result import Check, ExperimentResult, NullProgress, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import single_threaded
from normlab.nn import Linear, Parameter, ReLU
from normlab.nn.optim import AdamW
from normlab.precision import (
    FLOAT16,
    FLOAT32,
    DynamicLossScaler,
    MasterWeights,
    StaticLossScaler,
    mixed_precision_step,
    quantize,
)

__all__ = [
    "DETECTS",
    "NAME",
    "SCALE_EXPONENTS",
    "TITLE",
    "checks",
    "gradient_sample",
    "measure",
    "run",
    "tables",
]

NAME = "loss_scaling"
TITLE = "fp16 gradients and loss scaling (Micikevicius et al. 2017)"
DETECTS = (
    "dynamic loss scaler that never backs off (every step overflows and is skipped)",
    "loss scale fixed at 1 (no scaling)",
)

SCALE_EXPONENTS = tuple(range(0, 41, 2))  # S = 2^0 ... 2^40
INIT_SCALE, GROWTH_INTERVAL = 2.0**24, 50  # the dynamic scaler's start and growth interval
_LR = 0.01  # Adam learning rate (all three runs; Adam is blind to the gradients' scale)
_DEPTH = 3  # hidden layers
_OUTPUTS = 64  # K targets per example: the loss is a mean over B x K values
_PART = (0.05, 0.95)  # "part" of the gradients flush: between 5% and 95% at S = 1
_APPLIED_MIN = 0.9  # the scaled run must apply at least 90% of its steps
_DROP_MIN = 0.9  # ... and its loss must fall by at least 90% of fp32's fall
_GAP_MIN = 0.1  # unscaled fp16 "falls behind": final loss >= 10% above fp32's
_SAVED_MAX = 0.01  # at the dynamic scaler's median scale at most 1% of the values flush
_SAMPLE_EVERY = 10  # gradient histogram: every backward signal of every 10th fp32 step
_F16_TINY, _F16_NORMAL, _F16_MAX = 2.0**-24, 2.0**-14, 65504.0


class _Net:
    """A deep ReLU MLP with an optional fp16 rounding after every op."""

    def __init__(self, f: int, h: int, rng: np.random.Generator) -> None:
        self.layers: list[Any] = []
        fan_in = f
        for _ in range(_DEPTH):
            self.layers += [Linear(fan_in, h, rng=rng), ReLU()]
            fan_in = h
        self.layers.append(Linear(h, _OUTPUTS, rng=rng))
        self.params: list[Parameter] = [p for lay in self.layers for p in lay.parameters()]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The output in float32 (no rounding, no backward)."""
        h = x
        for lay in self.layers:
            h = lay.forward(h)
        return h

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray, scale: float, fp16: bool,
                       keep: list[np.ndarray] | None = None) -> float:
        """Forward and backward of ``scale * 0.5 mean (f(x) - y)^2``; returns the loss.

        Gradients land in each parameter's ``.grad``; ``keep`` collects every backward
        signal (the loss gradient, each activation gradient, each weight gradient).
        """
        rnd = (lambda a: quantize(a, FLOAT16)) if fp16 else (lambda a: a)
        for p in self.params:
            p.grad = None
        h = rnd(x)  # B,F
        for lay in self.layers:
            h = rnd(lay.forward(h))
        err = h.astype(np.float64) - y  # B,K
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is what S may cause
            d = rnd(np.float32(scale) * (err / err.size).astype(np.float32))  # B,K
            signals = [d]
            for lay in reversed(self.layers):
                d = rnd(np.asarray(lay.backward(d), dtype=np.float32))
                signals.append(d)
            for p in self.params:
                assert p.grad is not None
                p.grad = rnd(p.grad.astype(np.float32))
                signals.append(p.grad)
        if keep is not None:
            keep.extend(s.ravel().copy() for s in signals)
        return float(0.5 * np.mean(err**2))


def _data(settings: Settings) -> tuple[np.ndarray, np.ndarray, int, int]:
    f, h, b = settings.pick((16, 32, 256), (16, 48, 512), (32, 64, 1024))
    rng = np.random.default_rng([settings.seed, 4])
    x = rng.standard_normal((b, f)).astype(np.float32)  # B,F
    teacher = _Net(f, h, rng)  # same architecture: the student can fit it exactly
    y = teacher.forward(x).astype(np.float64)  # B,K
    return x, y, f, h


def _train(settings: Settings, mode: str, steps: int, progress: Progress,
           keep: list[np.ndarray] | None = None) -> dict[str, Any]:
    """Full-batch SGD in ``mode`` = "fp32", "fp16" (no scaling) or "fp16+scaler"."""
    x, y, f, h = _data(settings)
    net = _Net(f, h, np.random.default_rng([settings.seed, 40]))
    fp16 = mode != "fp32"
    master = MasterWeights(net.params, FLOAT16 if fp16 else FLOAT32)  # fp32 masters
    opt = AdamW(master.masters, lr=_LR, weight_decay=0.0)
    scaler: DynamicLossScaler | StaticLossScaler = StaticLossScaler(1.0)
    if mode == "fp16+scaler":
        scaler = DynamicLossScaler(init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    losses, scales, skipped = [], [], 0
    for t in range(steps):
        scales.append(scaler.scale)
        sample = keep if keep is not None and t % _SAMPLE_EVERY == 0 else None
        losses.append(net.loss_and_grads(x, y, scaler.scale, fp16=fp16, keep=sample))
        # unscale, skip on overflow, step the fp32 masters, refresh the working copy
        skipped += mixed_precision_step(master, opt, scaler).skipped
        progress.advance()
    losses.append(net.loss_and_grads(x, y, 1.0, fp16=fp16))  # after the last step
    return {"loss": np.array(losses), "scale": np.array(scales), "skipped": skipped}


def gradient_sample(settings: Settings, progress: Progress | None = None) -> np.ndarray:
    """Every backward signal of every 10th step of the fp32 run (as Figure 3), float32.

    Exact zeros (ReLU) included; the same values :func:`measure` histograms: one BLAS
    thread, as ``run`` uses (the thread count changes the products' summation order, and
    with it a few of the values that underflow to zero).
    """
    keep: list[np.ndarray] = []
    with single_threaded():
        _train(settings, "fp32", _steps(settings), progress or NullProgress(), keep)
    return np.concatenate(keep).astype(np.float32)


def _steps(settings: Settings) -> int:
    return int(settings.pick(200, 400, 1200))


def _flush_table(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fractions of the nonzero gradients flushed to zero / overflowing in fp16, per S."""
    nz = g[g != 0]
    flushed, overflow = [], []
    with np.errstate(over="ignore"):
        for e in SCALE_EXPONENTS:
            q = quantize(nz * np.float32(2.0**e), FLOAT16)
            flushed.append(float(np.mean(q == 0)))
            overflow.append(float(np.mean(~np.isfinite(q))))
    return np.array(flushed), np.array(overflow)


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Three training runs, the fp32 run's gradients and their fp16 fate per scale."""
    steps = _steps(settings)
    progress.start(3 * steps, "loss scaling")
    keep: list[np.ndarray] = []
    runs = {"fp32": _train(settings, "fp32", steps, progress, keep)}
    for mode in ("fp16", "fp16+scaler"):
        runs[mode] = _train(settings, mode, steps, progress)
    g = np.concatenate(keep).astype(np.float32)
    nz = g[g != 0]
    flushed, overflow = _flush_table(g)
    first_over = next((i for i, o in enumerate(overflow) if o > 0), len(overflow))
    drop = {m: float(r["loss"][0] - r["loss"][-1]) for m, r in runs.items()}
    return {
        "steps": steps, "runs": runs, "g": g, "nonzero": int(nz.size),
        "flushed": flushed, "overflow": overflow, "first_over": first_over,
        "subnormal": float(np.mean((np.abs(nz) >= _F16_TINY / 2) & (np.abs(nz) < _F16_NORMAL))),
        "drop": drop, "applied": 1.0 - runs["fp16+scaler"]["skipped"] / steps,
        "median_scale": float(np.median(runs["fp16+scaler"]["scale"])),
    }


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers ``m`` (see :func:`measure`)."""
    flushed, first_over = m["flushed"], m["first_over"]
    before = flushed[:first_over]
    best = int(np.argmin(before)) if first_over else 0
    final = {k: float(r["loss"][-1]) for k, r in m["runs"].items()}
    gap16 = final["fp16"] / final["fp32"] - 1.0
    drop_ratio = m["drop"]["fp16+scaler"] / m["drop"]["fp32"]
    k_med = int(np.argmin(np.abs(np.array(SCALE_EXPONENTS) - np.log2(m["median_scale"]))))
    saved = float(flushed[k_med])
    src = "Micikevicius et al. 2017, section 3.2"
    return [
        Check(
            source="Micikevicius et al. 2017, Figure 3",
            claim="Part of the gradients seen in training lie below fp16's smallest "
            "subnormal and become zero, while fp16's range above them goes unused.",
            criterion=f"at S = 1 between {100 * _PART[0]:g}% and {100 * _PART[1]:g}% of the "
            "nonzero gradients of the fp32 run flush to zero in fp16, and none overflows",
            measured=f"{100 * flushed[0]:.1f}% flushed at S = 1",
            passed=bool(_PART[0] <= flushed[0] <= _PART[1] and m["overflow"][0] == 0),
            values={"flushed_at_1": float(flushed[0])},
        ),
        Check(
            source=src,
            claim="Scaling the loss by S shifts the gradients into fp16's range; the flushed "
            "fraction cannot grow with S until values overflow.",
            criterion="flushed fraction non-increasing in S for every S below the first overflow",
            measured=f"{100 * flushed[0]:.1f}% at S=1 -> {100 * flushed[best]:.2f}% at "
            f"S=2^{SCALE_EXPONENTS[best]}; first overflow at "
            + (f"S=2^{SCALE_EXPONENTS[first_over]}" if first_over < len(flushed) else "none"),
            passed=bool(np.all(np.diff(before) <= 0) and first_over > 1),
            values={"scale_exponents": list(SCALE_EXPONENTS), "flushed": flushed.tolist(),
                    "overflow": m["overflow"].tolist()},
        ),
        Check(
            source=src,
            claim="Without loss scaling, the flushed gradients are lost and fp16 training "
            "falls behind fp32.",
            criterion=f"unscaled fp16's final loss >= {100 * _GAP_MIN:g}% above fp32's "
            "(NOT REPRODUCED otherwise: the claim is the paper's, the numbers are ours)",
            measured=f"final loss fp16 {final['fp16']:.4g} vs fp32 {final['fp32']:.4g} "
            f"({100 * gap16:+.1f}%)",
            passed=bool(gap16 >= _GAP_MIN),
            values={"relative_gap": gap16, "final": final},
            if_false="NOT REPRODUCED",
        ),
        Check(
            source=src,
            claim="With dynamic loss scaling the gradients move into fp16's range and fp16 "
            "training matches fp32.",
            criterion=f"at the scaler's median scale <= {100 * _SAVED_MAX:g}% of the gradients "
            f"flush, >= {100 * _APPLIED_MIN:g}% of the steps are applied (not skipped for "
            f"overflow) and the loss falls >= {100 * _DROP_MIN:g}% as far as fp32's",
            measured=f"{100 * saved:.2f}% flushed at S = 2^{SCALE_EXPONENTS[k_med]}; "
            f"{100 * m['applied']:.1f}% applied; loss fall {100 * drop_ratio:.1f}% of fp32's "
            f"(final {final['fp16+scaler']:.4g} vs {final['fp32']:.4g})",
            passed=bool(saved <= _SAVED_MAX and m["applied"] >= _APPLIED_MIN
                        and drop_ratio >= _DROP_MIN),
            values={"flushed_at_median_scale": saved, "applied_fraction": m["applied"],
                    "drop_ratio": drop_ratio},
        ),
    ]


def tables(m: dict[str, Any]) -> list[str]:
    """One row per run: losses and skipped steps."""
    rows = [[mode, f"{r['loss'][0]:.4g}", f"{r['loss'][-1]:.4g}", r["skipped"]]
            for mode, r in m["runs"].items()]
    return [markdown_table(["run", "initial loss", "final loss", "skipped steps"], rows)]


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Histogram, flushed fraction against S, and three training runs."""
    with single_threaded():  # tiny arrays: threads would only wait on each other
        m = measure(settings, progress)
    runs = m["runs"]
    summary = (
        f"A {_DEPTH}-hidden-layer ReLU MLP trained {m['steps']} full-batch SGD steps (lr "
        f"{_LR:g}) on the mean squared error, no factor on the loss. {m['nonzero']} nonzero "
        f"backward signals collected every {_SAMPLE_EVERY}th step of the fp32 run: "
        f"{100 * m['flushed'][0]:.1f}% flush to zero and {100 * m['subnormal']:.1f}% are fp16 "
        f"subnormals without scaling. The dynamic scaler starts at 2^{int(np.log2(INIT_SCALE))} "
        f"(GradScaler's rules, growth every {GROWTH_INTERVAL} clean steps)."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks(m),
        figures={"histogram": plot_histogram(m["g"], m["median_scale"]),
                 "flushed": plot_flush(SCALE_EXPONENTS, m["flushed"], m["overflow"]),
                 "training": plot_training(runs)},
        tables=tables(m),
        metrics={
            "nonzero_gradients": m["nonzero"],
            "scale_exponents": list(SCALE_EXPONENTS),
            "flushed_fraction": m["flushed"].tolist(),
            "overflow_fraction": m["overflow"].tolist(),
            "final_loss": {k: float(r["loss"][-1]) for k, r in runs.items()},
            "scale_trace": runs["fp16+scaler"]["scale"].tolist(),
            "skipped_steps": runs["fp16+scaler"]["skipped"],
            "applied_fraction": m["applied"],
        },
        settings={"steps": m["steps"], "depth": _DEPTH, "init_scale":
                  f"2^{int(np.log2(INIT_SCALE))}", "growth_interval": GROWTH_INTERVAL,
                  "learning_rate": _LR},
    )
