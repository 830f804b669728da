"""Experiment 6: BatchNorm vs LayerNorm, the chapter's argument (section 16.1).

"BatchNorm asks, for this feature, what did the current batch look like? LayerNorm asks,
for this example, what is the scale of its feature vector? The second question has the
same answer whether the example is trained alone, packed with other sequences, or decoded
one token at a time." Measured in float64 on sequences of feature vectors:

1. one example's LayerNorm output computed alone, inside several different batches, and
   position by position (as in decoding) is the same to 1e-12 (float64 rounding);
2. its BatchNorm output (training mode: statistics over batch and time) changes with the
   batch it sits in, and a single decoded position cannot be normalised at all in training
   mode (one value per feature); eval mode uses running statistics instead;
3. BatchNorm's train/eval gap - |train-mode output - eval-mode output| on the same batch,
   after running statistics were accumulated with batches of that size - grows as the batch
   shrinks (Ioffe & Szegedy 2015 and Ioffe 2017 on small minibatches); plain sampling noise
   of the batch statistics explains most of that growth (about sqrt(64) = 8 between batch
   2 and 128), so the experiment adds what the BatchNorm paper itself shows:
4. Ioffe & Szegedy 2015, Figure 1: a 3-hidden-layer sigmoid MLP trained with SGD with and
   without BatchNorm (same weights, same batches; a synthetic 10-class task instead of
   MNIST): test accuracy against steps, and the 15th/50th/85th percentiles of the input of
   one last-layer sigmoid, which drift without BatchNorm and stay put with it
   (`normlab.lab.experiments._ioffe_mlp`).

Shapes: B sequences, T positions, C features.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab import batch_norm_forward, layer_norm_forward
from normlab.lab.experiments._ioffe_mlp import ioffe_figure, ioffe_mlp, median_drift
from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import on_references
from normlab.nn import BatchNorm

__all__ = [
    "BATCH_SIZES",
    "DETECTS",
    "NAME",
    "TITLE",
    "checks",
    "composition_changes",
    "measure",
    "median_drift",
    "run",
    "tables",
    "train_eval_gap",
]

NAME = "batch_vs_layer"
TITLE = "BatchNorm vs LayerNorm: batch composition, decoding, train/eval gap"
DETECTS = ("BatchNorm in eval mode normalising with the batch's statistics",)
BATCH_SIZES = (2, 4, 8, 32, 128)
"""The batch sizes of the train/eval gap (claim 3), smallest first."""
SAME_TOL = 1e-12  # float64 rounding of a 16-wide row is ~1e-16
"""Claim 1: the largest relative difference of LayerNorm outputs that counts as the same."""
CHANGED_MIN = 0.05  # "depends on the batch": relative change of at least 5%
"""Claim 2: the smallest relative change of BatchNorm outputs that counts as changed."""
GAP_RATIO_MIN = 4.0  # gap(2) / gap(128); the batch noise alone predicts about sqrt(64) = 8
"""Claim 3: the smallest ratio gap(2) / gap(128) of the train/eval gaps."""
ACC_MARGIN = 0.1  # Figure 1(a): BatchNorm ends at least 10 points of accuracy higher ...
"""Claim 4 (Figure 1(a)): BatchNorm's least lead in final test accuracy (a fraction)."""
REACH_FRACTION = 1 / 3  # ... and reaches the plain network's final accuracy within 1/3 of the steps
"""Claim 4: the largest fraction of the steps BatchNorm may take to reach the plain
network's final accuracy."""
DRIFT_BN_MAX = 0.25  # Figure 1(b, c): median drift, in spreads
"""Claim 4 (Figure 1(b, c)): the largest median drift with BatchNorm, in spreads
(85th minus 15th percentile)."""
DRIFT_PLAIN_MIN = 1.0
"""Claim 4 (Figure 1(b, c)): the smallest median drift without BatchNorm, in spreads."""
_C, _T = 16, 12


def _data(rng: np.random.Generator, b: int, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    return mu + sigma * rng.standard_normal((b, _T, _C))  # B,T,C


def _bn(x: np.ndarray) -> np.ndarray:
    out, _ = batch_norm_forward(x, None, None, None, None, True)
    return out


def composition_changes(seed: int, n_batches: int = 6) -> dict[str, float]:
    """Max relative change of one example's output: alone, in batches, decoded by position."""
    rng = np.random.default_rng(seed)
    mu, sigma = rng.normal(0.0, 2.0, _C), rng.uniform(0.5, 3.0, _C)  # C, C
    example = _data(rng, 1, mu, sigma)  # 1,T,C
    ln_alone, _ = layer_norm_forward(example, None, None)
    bn_ref = None
    ln_diff = bn_diff = 0.0
    for _ in range(n_batches):
        others = _data(rng, int(rng.integers(2, 9)), mu, sigma)
        batch = np.concatenate([others[:1], example, others[1:]])  # B,T,C (example at 1)
        ln_in, _ = layer_norm_forward(batch, None, None)
        ln_diff = max(ln_diff, float(np.max(np.abs(ln_in[1:2] - ln_alone))))
        bn_in = _bn(batch)[1:2]
        bn_ref = bn_in if bn_ref is None else bn_ref
        bn_diff = max(bn_diff, float(np.max(np.abs(bn_in - bn_ref))))
    decode = np.concatenate(
        [layer_norm_forward(example[:, t : t + 1], None, None)[0] for t in range(_T)], axis=1
    )  # 1,T,C: one position at a time
    ln_decode = float(np.max(np.abs(decode - ln_alone)))
    try:
        batch_norm_forward(example[:, :1, :].reshape(1, _C), None, None, None, None, True)
        bn_decodes = True
    except ValueError:  # one value per feature: training-mode statistics do not exist
        bn_decodes = False
    scale = float(np.max(np.abs(ln_alone)))
    return {
        "ln_in_batches": ln_diff / scale,
        "ln_decode": ln_decode / scale,
        "bn_in_batches": bn_diff / scale,
        "bn_single_position_ok": float(bn_decodes),
    }


def train_eval_gap(seed: int, batch: int, steps: int, probes: int) -> float:
    """Mean |train-mode - eval-mode| BatchNorm output on batches of size `batch`.

    Running statistics are accumulated over `steps` training batches (momentum 0.9, the
    chapter's convention), then `probes` fresh batches go through both modes.
    """
    rng = np.random.default_rng([seed, batch])
    mu, sigma = rng.normal(0.0, 2.0, _C), rng.uniform(0.5, 3.0, _C)
    layer = BatchNorm(_C, dtype=np.float64)
    layer.train()
    for _ in range(steps):
        layer.forward(_data(rng, batch, mu, sigma)[:, 0])  # B,C: one position per example
    gaps = []
    for _ in range(probes):
        x = _data(rng, batch, mu, sigma)[:, 0]  # B,C
        layer.train()
        saved = (layer.running_mean.copy(), layer.running_var.copy())
        train_out = layer.forward(x)
        layer.running_mean[...], layer.running_var[...] = saved  # probing must not train
        layer.eval()
        gaps.append(float(np.mean(np.abs(train_out - layer.forward(x)))))
    return float(np.mean(gaps))


def _figure(comp: dict[str, float], gaps: dict[int, float]) -> object:
    fig, (ax1, ax2) = new_figure(1, 2, width=5.2, height=4.2)
    labels = ["LayerNorm\nin batches", "LayerNorm\ndecoded", "BatchNorm\nin batches"]
    values = [comp["ln_in_batches"], comp["ln_decode"], comp["bn_in_batches"]]
    bars = ax1.bar(labels, np.maximum(values, 1e-17), color=["C0", "C0", "C3"])
    ax1.set_yscale("log")
    ax1.set_ylim(top=30.0)  # room for the value labels
    for bar, v in zip(bars, values, strict=True):
        text = "exactly 0" if v == 0 else f"{v:.2g}"
        ax1.text(bar.get_x() + bar.get_width() / 2, max(v, 1e-17) * 3, text, ha="center")
    ax1.axhline(SAME_TOL, color="k", ls=":", lw=1, label="1e-12 (float64 rounding level)")
    ax1.set(
        ylabel="max relative change of one example's output", title="Same example, other company"
    )
    ax1.legend(fontsize=8)
    sizes = np.array(sorted(gaps))
    g = np.maximum([gaps[b] for b in sizes], 1e-12)  # a broken eval mode gives 0: keep log axes
    ax2.loglog(sizes, g, "o-", color="C3", label="BatchNorm train vs eval")
    ax2.loglog(sizes, g[0] * np.sqrt(sizes[0] / sizes), "k:", lw=1, label="1/sqrt(batch) reference")
    ax2.set(
        xlabel="batch size",
        ylabel="mean |train output - eval output|",
        title="BatchNorm train/eval gap",
    )
    ax2.set_xticks(sizes, [str(b) for b in sizes])
    ax2.legend(fontsize=8)
    return fig


def _figure1_checks(mlp: dict) -> list[Check]:
    """Ioffe & Szegedy 2015, Figure 1, judged on the two networks' curves."""
    plain, bn = mlp["plain"]["accuracy"], mlp["bn"]["accuracy"]
    reached = np.flatnonzero(bn >= plain[-1])
    reach = mlp["steps"][int(reached[0])] / mlp["steps"][-1] if reached.size else float("inf")
    drift = {k: median_drift(mlp[k]["percentiles"]) for k in ("plain", "bn")}
    src = "Ioffe & Szegedy 2015, Figure 1"
    return [
        Check(
            f"{src}(a)",
            "With BatchNorm the network trains faster and reaches higher test accuracy.",
            f"final accuracy >= {ACC_MARGIN:g} above the plain network's, which BatchNorm reaches "
            f"within {REACH_FRACTION:.2g} of the steps",
            f"final {bn[-1]:.3f} vs {plain[-1]:.3f}; reached after {reach:.2g} of the steps",
            bool(bn[-1] >= plain[-1] + ACC_MARGIN and reach <= REACH_FRACTION),
            {"final_bn": float(bn[-1]), "final_plain": float(plain[-1]), "reach": reach},
        ),
        Check(
            f"{src}(b, c)",
            "Without BatchNorm the input distribution of a sigmoid keeps moving during "
            "training; with BatchNorm it stays put.",
            f"largest move of the median (in 15th-85th percentile spreads) <= "
            f"{DRIFT_BN_MAX:g} with BatchNorm and >= {DRIFT_PLAIN_MIN:g} without",
            f"with {drift['bn']:.3f}, without {drift['plain']:.2f}",
            bool(drift["bn"] <= DRIFT_BN_MAX and drift["plain"] >= DRIFT_PLAIN_MIN),
            drift,
        ),
    ]


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Composition and decoding changes, train/eval gaps per batch size, the Figure 1 MLP."""
    steps, probes = settings.pick((60, 30), (200, 200), (600, 1000))
    mlp_steps = settings.pick(300, 600, 2000)
    progress.start(2 + len(BATCH_SIZES), "BatchNorm vs LayerNorm")
    comp = composition_changes(settings.seed)
    progress.advance()
    gaps = {}
    for b in BATCH_SIZES:
        gaps[b] = train_eval_gap(settings.seed, b, steps, probes)
        progress.advance()
    mlp = ioffe_mlp(settings.seed, mlp_steps, 10)
    progress.advance()
    return {"comp": comp, "gaps": gaps, "mlp": mlp, "steps": steps, "probes": probes,
            "mlp_steps": mlp_steps}


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers `m`.

    See [measure][normlab.lab.experiments.batch_vs_layer.measure].
    """
    comp, gaps = m["comp"], m["gaps"]
    g = [gaps[b] for b in BATCH_SIZES]
    # a broken eval mode can make the gaps 0: the check must then FAIL, not divide by zero
    ratio = g[0] / g[-1] if g[-1] > 0 else float("nan")
    monotone = bool(np.all(np.diff(g) < 0))
    ln_same = max(comp["ln_in_batches"], comp["ln_decode"])
    src = "chapter 16.1 (Ba et al. 2016; Ioffe & Szegedy 2015)"
    noise = float(np.sqrt(BATCH_SIZES[-1] / BATCH_SIZES[0]))  # sampling noise alone
    return [
        Check(
            src,
            "LayerNorm gives an example the same output alone, in any batch, and decoded one "
            "position at a time",
            f"max relative difference <= {SAME_TOL:g} (float64)",
            f"in batches {comp['ln_in_batches']:.1e}, decoded {comp['ln_decode']:.1e}",
            ln_same <= SAME_TOL,
            {"in_batches": comp["ln_in_batches"], "decoded": comp["ln_decode"]},
        ),
        Check(
            src,
            "BatchNorm (training) normalises with the batch's statistics, so an example's "
            "output depends on its company, and one decoded position has no statistics",
            f"relative change across batches >= {CHANGED_MIN:g}, and a single position is "
            "rejected in training mode",
            f"change {comp['bn_in_batches']:.2f}; single position "
            + ("accepted" if comp["bn_single_position_ok"] else "rejected (ValueError)"),
            comp["bn_in_batches"] >= CHANGED_MIN and not comp["bn_single_position_ok"],
            {"in_batches": comp["bn_in_batches"]},
        ),
        Check(
            "chapter 16.1; Ioffe 2017 (Batch Renormalization)",
            "BatchNorm's training statistics are not inference statistics, and the gap grows "
            "as the batch shrinks",
            f"gap falls strictly with batch size in {list(BATCH_SIZES)} and "
            f"gap(2) / gap(128) >= {GAP_RATIO_MIN:g}",
            ", ".join(f"b={b}: {gaps[b]:.3f}" for b in BATCH_SIZES) + f"; ratio {ratio:.1f} "
            f"(sampling noise of the batch statistics alone predicts about {noise:.0f})",
            bool(monotone and ratio >= GAP_RATIO_MIN),
            {"gaps": {str(b): gaps[b] for b in BATCH_SIZES}, "ratio": ratio},
        ),
        *_figure1_checks(m["mlp"]),
    ]


def tables(m: dict[str, Any]) -> list[str]:
    """The train/eval gap per batch size; the Figure 1 accuracies."""
    header = ["batch size", "mean abs(train - eval) BatchNorm", "LayerNorm"]
    gaps = markdown_table(header, [[b, f"{m['gaps'][b]:.4f}", "0 (no modes)"]
                                   for b in BATCH_SIZES])
    mlp = m["mlp"]
    acc = markdown_table(["step", "test accuracy without BatchNorm", "with BatchNorm"],
                         [[t, f"{a:.3f}", f"{b:.3f}"] for t, a, b in zip(
                             mlp["steps"], mlp["plain"]["accuracy"], mlp["bn"]["accuracy"],
                             strict=True)])
    return [gaps, acc]


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Compare BatchNorm and LayerNorm on batch composition, decoding and train/eval."""
    m = measure(settings, progress)
    comp, gaps, mlp = m["comp"], m["gaps"], m["mlp"]
    steps, probes, mlp_steps = m["steps"], m["probes"], m["mlp_steps"]
    return ExperimentResult(
        name=NAME,
        title=TITLE,
        seed=settings.seed,
        summary=(
            f"Sequences of {_T} positions with {_C} features whose means and scales differ "
            "per feature. One example is normalised alone, inside batches of 3 to 9 "
            "sequences, and one position at a time, with `layer_norm_forward` and "
            "`batch_norm_forward` (training mode, statistics over batch and time). Then "
            "`nn.BatchNorm` accumulates running statistics with batches of a given size and "
            "its training-mode and eval-mode outputs are compared on fresh batches. Last, "
            f"Figure 1 of Ioffe & Szegedy: a 3 x 64 sigmoid MLP trained {mlp_steps} SGD steps "
            "(batch 60) with and without BatchNorm on a synthetic 10-class task."
        ),
        checks=checks(m),
        figures={"outputs": _figure(comp, gaps), "ioffe_fig1": ioffe_figure(mlp)},
        tables=tables(m),
        metrics={"composition": comp, "train_eval_gap": {str(b): v for b, v in gaps.items()},
                 "mlp_steps": mlp["steps"],
                 "mlp": {k: {"accuracy": mlp[k]["accuracy"].tolist(),
                             "percentiles": mlp[k]["percentiles"].tolist()}
                         for k in ("plain", "bn")}},
        settings={
            "features": _C,
            "positions": _T,
            "running_stat_steps": steps,
            "probe_batches": probes,
            "batch_sizes": list(BATCH_SIZES),
            "mlp_steps": mlp_steps,
        },
    )


@on_references
def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the experiment (see the module docstring) on the NumPy references, one thread."""
    return _run(settings, progress)
