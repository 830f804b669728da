"""Experiment 4: fp16 gradients, the range they fall in, and loss scaling.

Micikevicius et al. 2017 ("Mixed Precision Training", section 3.2 and Figure 3): many
activation gradients lie below fp16's smallest subnormal (2^-24) and flush to zero;
multiplying the loss by a scale S shifts every gradient up by log2(S) binades, which saves
them as long as the largest one stays below fp16's max (65504); a dynamic scaler finds S by
backing off on overflow and growing after a run of clean steps.

Setup: a 3-layer ReLU MLP regressing a random teacher, its loss multiplied by a small
``loss_weight`` (as a mean over many tokens or a small auxiliary loss would make it) and the
learning rate divided by it, so the fp32 run is unchanged while the gradients are tiny. The
fp16 runs round weights, activations and every backward signal to fp16 and keep fp32 master
weights (the step itself is not the problem here): ``MasterWeights`` and
``mixed_precision_step`` (unscale, skip on overflow, step, refresh) from
:mod:`normlab.precision`, with a ``StaticLossScaler(1)`` or a ``DynamicLossScaler``.
Dimension letters: B = batch, F = input features, H = hidden width.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.training import single_threaded
from normlab.nn import Linear, Parameter, ReLU
from normlab.nn.optim import SGD
from normlab.precision import (
    FLOAT16,
    FLOAT32,
    DynamicLossScaler,
    MasterWeights,
    StaticLossScaler,
    mixed_precision_step,
    quantize,
)

__all__ = ["LOSS_WEIGHT", "NAME", "SCALE_EXPONENTS", "TITLE", "gradient_sample", "run"]

NAME = "loss_scaling"
TITLE = "fp16 gradients and loss scaling (Micikevicius et al. 2017)"

LOSS_WEIGHT = 2.0**-20  # makes the gradients small; the learning rate is divided by it
SCALE_EXPONENTS = tuple(range(0, 47, 2))  # S = 2^0 ... 2^46
_LR = 0.05  # effective learning rate (lr / LOSS_WEIGHT is what SGD sees)
_STALL_MAX = 0.1  # fp16 without scaling: loss falls by < 10% of what fp32 achieves
_MATCH_TOL = 0.05  # dynamic scaler: final loss within 5% of fp32's
_F16_TINY = 2.0**-24  # fp16 smallest subnormal
_F16_NORMAL = 2.0**-14  # fp16 smallest normal
_F16_MAX = 65504.0


class _Net:
    """Linear-ReLU-Linear-ReLU-Linear with an optional fp16 rounding after every op."""

    def __init__(self, f: int, h: int, rng: np.random.Generator) -> None:
        self.layers: list[Any] = [
            Linear(f, h, rng=rng), ReLU(), Linear(h, h, rng=rng), ReLU(), Linear(h, 1, rng=rng)
        ]
        self.params: list[Parameter] = [p for lay in self.layers for p in lay.parameters()]

    def _round(self, a: np.ndarray, fp16: bool) -> np.ndarray:
        return quantize(a, FLOAT16) if fp16 else a

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray, scale: float, fp16: bool,
                       keep: list[np.ndarray] | None = None) -> float:
        """Forward and backward of ``scale * LOSS_WEIGHT * 0.5 mean (f(x) - y)^2``.

        The weights are used as they are (a fp16 working copy when training in fp16);
        gradients land in each parameter's ``.grad``; ``keep`` collects every backward
        signal. Returns the unweighted loss 0.5 mean (f(x) - y)^2.
        """
        for p in self.params:
            p.grad = None
        h = self._round(x, fp16)  # B,F
        for lay in self.layers:
            h = self._round(lay.forward(h), fp16)
        err = h[:, 0].astype(np.float64) - y  # B
        # d(loss)/d(out), formed in float32 and rounded to fp16: the first flush happens here.
        with np.errstate(over="ignore", invalid="ignore"):
            d = (np.float32(scale * LOSS_WEIGHT) * (err / err.size).astype(np.float32))[:, None]
            d = self._round(d.astype(np.float32), fp16)  # B,1
            if keep is not None:
                keep.append(d.ravel())
            for lay in reversed(self.layers):
                d = self._round(np.asarray(lay.backward(d), dtype=np.float32), fp16)
                if keep is not None:
                    keep.append(d.ravel())
            for p in self.params:
                assert p.grad is not None
                p.grad = self._round(p.grad.astype(np.float32), fp16)
                if keep is not None:
                    keep.append(p.grad.ravel())
        return float(0.5 * np.mean(err**2))


def _data(settings: Settings) -> tuple[np.ndarray, np.ndarray, int, int]:
    f, h, b = settings.pick((16, 32, 64), (16, 64, 128), (32, 128, 256))
    rng = np.random.default_rng([settings.seed, 4])
    x = rng.standard_normal((b, f)).astype(np.float32)  # B,F
    teacher = rng.standard_normal(f) / np.sqrt(f)  # F
    y = np.tanh(2.0 * x.astype(np.float64) @ teacher)  # B
    return x, y, f, h


def gradient_sample(settings: Settings) -> np.ndarray:
    """Every backward signal of the fp32 network at initialisation (loss weighted), float32.

    The activation gradients, the loss gradient and the weight gradients of one batch,
    concatenated; exact zeros (ReLU) included.
    """
    x, y, f, h = _data(settings)
    net = _Net(f, h, np.random.default_rng([settings.seed, 40]))
    keep: list[np.ndarray] = []
    net.loss_and_grads(x, y, 1.0, fp16=False, keep=keep)
    return np.concatenate(keep).astype(np.float32)


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


def _train(settings: Settings, mode: str, steps: int, progress: Progress) -> dict[str, Any]:
    """Full-batch SGD in ``mode`` = "fp32", "fp16" (no scaling) or "fp16+scaler"."""
    x, y, f, h = _data(settings)
    net = _Net(f, h, np.random.default_rng([settings.seed, 40]))
    fp16 = mode != "fp32"
    master = MasterWeights(net.params, FLOAT16 if fp16 else FLOAT32)  # fp32 masters
    opt = SGD(master.masters, lr=_LR / LOSS_WEIGHT)
    scaler: DynamicLossScaler | StaticLossScaler = StaticLossScaler(1.0)
    if mode == "fp16+scaler":
        scaler = DynamicLossScaler(init_scale=2.0**40, growth_interval=50)
    losses, scales, applied, skipped = [], [], [], 0
    for t in range(steps):
        scale = scaler.scale
        losses.append(net.loss_and_grads(x, y, scale, fp16=fp16))
        applied.append(t - skipped)  # optimizer updates made before this loss was measured
        scales.append(scale)
        # unscale, skip on overflow, step the fp32 masters, refresh the working copy
        skipped += mixed_precision_step(master, opt, scaler).skipped
        progress.advance()
    return {"loss": np.array(losses), "scale": np.array(scales), "skipped": skipped,
            "applied": applied[-1]}


def _plot_histogram(g: np.ndarray, scale: float) -> Any:
    fig, ax = new_figure(width=7.0, height=5.0)
    nz = np.abs(g[g != 0]).astype(np.float64)
    bins = np.arange(np.floor(np.log2(nz.min())) - 1, np.log2(nz.max() * scale) + 2, 0.5)
    ax.hist(np.log2(nz), bins=bins, color="tab:blue", alpha=0.8, label="|g| (fp32)")
    ax.hist(np.log2(nz * scale), bins=bins, histtype="step", color="tab:purple", lw=1.5,
            label=f"|g| * S, S = 2^{int(np.log2(scale))} (the dynamic scaler's median)")
    ax.axvspan(bins[0], -25, color="tab:red", alpha=0.15, label="flushed to 0 in fp16 (<= 2^-25)")
    ax.axvspan(-25, np.log2(_F16_NORMAL), color="tab:orange", alpha=0.15,
               label="fp16 subnormals (2^-24 ... 2^-14)")
    ax.axvspan(np.log2(_F16_NORMAL), np.log2(_F16_MAX), color="tab:green", alpha=0.1,
               label="fp16 normals (2^-14 ... 65504)")
    ax.set(xlabel="log2 |gradient value|", ylabel="count (nonzero values)",
           title=f"Backward signals of a small MLP, loss weighted by 2^{int(np.log2(LOSS_WEIGHT))}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return fig


def _plot_flush(flushed: np.ndarray, overflow: np.ndarray) -> Any:
    fig, ax = new_figure()
    s = 2.0 ** np.array(SCALE_EXPONENTS)
    ax.plot(s, 100 * flushed, marker="o", label="flushed to zero")
    ax.plot(s, 100 * overflow, marker="s", label="overflow to inf")
    ax.set(xscale="log", xlabel="loss scale S", ylabel="% of nonzero gradients",
           title="fp16 fate of the gradients g * S")
    ax.set_xscale("log", base=2)
    ax.legend()
    return fig


def _plot_training(runs: dict[str, dict[str, Any]]) -> Any:
    fig, (ax0, ax1) = new_figure(1, 2)
    for mode, out in runs.items():
        ax0.plot(np.arange(1, out["loss"].size + 1), out["loss"], label=mode)
    ax0.set(yscale="log", xlabel="step", ylabel="training loss (MSE, unweighted)",
            title="Training with a tiny loss")
    ax0.legend()
    tr = runs["fp16+scaler"]["scale"]
    ax1.plot(np.arange(1, tr.size + 1), tr, color="tab:purple")
    ax1.set(xlabel="step", ylabel="loss scale S", title="Dynamic loss scale trace")
    ax1.set_yscale("log", base=2)
    return fig


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Histogram, flushed fraction against S, and three training runs."""
    with single_threaded():  # tiny arrays: threads would only wait on each other
        return _run(settings, progress)


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    steps = settings.pick(200, 500, 1500)
    progress.start(3 * steps, "loss scaling")
    g = gradient_sample(settings)
    nz = g[g != 0]
    flushed, overflow = _flush_table(g)
    first_over = next((i for i, o in enumerate(overflow) if o > 0), len(overflow))
    before = flushed[:first_over]
    monotone = bool(np.all(np.diff(before) <= 0))
    modes = ("fp32", "fp16", "fp16+scaler")
    runs = {mode: _train(settings, mode, steps, progress) for mode in modes}
    l32, l16, lsc = (runs[m]["loss"] for m in ("fp32", "fp16", "fp16+scaler"))
    drop32 = l32[0] - l32[-1]
    stall = (l16[0] - l16[-1]) / drop32
    # a skipped step makes no update: compare after the same number of updates (fp32 skips none)
    same = int(runs["fp16+scaler"]["applied"])
    match = abs(lsc[-1] - l32[same]) / l32[same]
    best = int(np.argmin(flushed[:first_over])) if first_over else 0
    median_scale = float(np.median(runs["fp16+scaler"]["scale"]))
    checks = [
        Check(
            source="Micikevicius et al. 2017, Figure 3",
            claim="Many gradient values lie below fp16's smallest subnormal and become zero.",
            criterion="at S = 1 at least 25% of the nonzero gradients flush to zero in fp16",
            measured=f"{100 * flushed[0]:.1f}% flushed at S = 1",
            passed=bool(flushed[0] >= 0.25),
            values={"flushed_at_1": float(flushed[0])},
        ),
        Check(
            source="Micikevicius et al. 2017, section 3.2",
            claim="Scaling the loss by S shifts the gradients into fp16's range; the flushed "
            "fraction cannot grow with S until values overflow.",
            criterion="flushed fraction non-increasing in S for every S below the first overflow",
            measured=f"{100 * flushed[0]:.1f}% at S=1 -> {100 * flushed[best]:.2f}% at "
            f"S=2^{SCALE_EXPONENTS[best]}; first overflow at "
            + (f"S=2^{SCALE_EXPONENTS[first_over]}" if first_over < len(overflow) else "none"),
            passed=monotone and first_over > 1,
            values={"scale_exponents": list(SCALE_EXPONENTS), "flushed": flushed.tolist(),
                    "overflow": overflow.tolist()},
        ),
        Check(
            source="Micikevicius et al. 2017, section 3.2",
            claim="Without loss scaling, fp16 training with such small gradients stalls.",
            criterion=f"fp16 (no scaling) loss falls by < {int(_STALL_MAX * 100)}% of the "
            "fall of the fp32 run",
            measured=f"{100 * stall:.1f}% of fp32's fall",
            passed=bool(stall < _STALL_MAX),
            values={"fraction_of_fp32_drop": float(stall)},
        ),
        Check(
            source="Micikevicius et al. 2017, section 3.2",
            claim="With (dynamic) loss scaling, fp16 training matches fp32.",
            criterion=f"final loss within {int(_MATCH_TOL * 100)}% of the fp32 run's after the "
            "same number of applied updates (overflowing steps are skipped)",
            measured=f"fp32 {l32[same]:.4g}, fp16+scaler {lsc[-1]:.4g} ({100 * match:.2f}% "
            f"apart) after {same} updates; {runs['fp16+scaler']['skipped']} steps skipped",
            passed=bool(match <= _MATCH_TOL),
            values={"fp32_same_updates": float(l32[same]), "scaled_final": float(lsc[-1]),
                    "updates": same, "relative_gap": float(match)},
        ),
    ]
    rows = ["| run | initial loss | final loss | skipped steps |", "|---|---|---|---|"]
    for mode, out in runs.items():
        rows.append(f"| {mode} | {out['loss'][0]:.4g} | {out['loss'][-1]:.4g} | {out['skipped']} |")
    frac_sub = float(np.mean((np.abs(nz) >= _F16_TINY / 2) & (np.abs(nz) < _F16_NORMAL)))
    summary = (
        f"A 3-layer ReLU MLP, loss weighted by 2^{int(np.log2(LOSS_WEIGHT))} (learning rate "
        f"divided by the same factor), trained {steps} full-batch SGD steps. "
        f"{len(nz)} nonzero gradient values at initialisation: {100 * flushed[0]:.1f}% flush to "
        f"zero and {100 * frac_sub:.1f}% are fp16 subnormals without scaling. The dynamic "
        "scaler starts at 2^40 (GradScaler's rules, growth every 50 clean steps)."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks,
        figures={"histogram": _plot_histogram(g, median_scale),
                 "flushed": _plot_flush(flushed, overflow),
                 "training": _plot_training(runs)},
        tables=["\n".join(rows)],
        metrics={
            "loss_weight": LOSS_WEIGHT,
            "nonzero_gradients": int(nz.size),
            "scale_exponents": list(SCALE_EXPONENTS),
            "flushed_fraction": flushed.tolist(),
            "overflow_fraction": overflow.tolist(),
            "final_loss": {m: float(out["loss"][-1]) for m, out in runs.items()},
            "scale_trace": runs["fp16+scaler"]["scale"].tolist(),
            "skipped_steps": runs["fp16+scaler"]["skipped"],
        },
        settings={"steps": steps, "loss_weight": f"2^{int(np.log2(LOSS_WEIGHT))}",
                  "init_scale": "2^40", "growth_interval": 50, "learning_rate": _LR},
    )
