"""Experiment 5: the invariance table of Ba et al. 2016 (Table 1), extended with RMSNorm.

A layer computes summed inputs `a = x W^T` and normalises them, `h = g * norm(a) + b`
(the non-linearity after it does not change what is invariant). Each transformation of the
weights or of the data is applied and `h` recomputed in float64; a cell is "invariant"
when every output changes by at most 1e-12 relatively (float64 rounding of these sizes is
~1e-15), "no" when some output changes by more than 1e-6, and undecided in between.

Normalisations: BatchNorm (training mode, batch statistics), WeightNorm
(`g * (w_i . x) / ||w_i||`, written here in one line: normlab has no weight-norm layer),
LayerNorm and RMSNorm, through the functional core. `eps = 1e-300`: positive as the API
requires, and below half an ulp of every variance here, so `var + eps == var` exactly and
the table is the one of the normalisation itself (the papers ignore eps).

Expected (Ba et al. 2016 Table 1; RMSNorm: Zhang & Sennrich 2019, Table 1): see PAPER.
Shapes: N examples, I input features, H hidden units.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from normlab import batch_norm_forward, layer_norm_forward, rms_norm_forward
from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import on_references

__all__ = ["DETECTS", "METHODS", "NAME", "PAPER", "TITLE", "TRANSFORMS", "invariance_matrix", "run"]

DETECTS = ("LayerNorm without its mean subtraction (test_exp_invariance)",)
NAME = "invariance"
TITLE = "Invariance table (Ba et al. 2016, Table 1), extended with RMSNorm"
EPS = 1e-300
"""The normalisers' eps: positive, and below half an ulp of every variance here."""
INVARIANT_TOL = 1e-12
"""The largest relative change of the outputs that reads "Invariant" (float64)."""
CHANGED_TOL = 1e-6
"""The smallest relative change of the outputs that reads "No" (not invariant)."""
METHODS = ("BatchNorm", "WeightNorm", "LayerNorm", "RMSNorm")
"""The table's rows: the normalisation methods."""
TRANSFORMS = (
    "weight matrix re-scaling",
    "weight matrix re-centering",
    "weight vector re-scaling",
    "dataset re-scaling",
    "dataset re-centering",
    "single training case re-scaling",
)
"""The table's columns: the re-scalings and re-centerings of weights and data."""
# True = invariant, in the column order of TRANSFORMS.
PAPER: dict[str, tuple[bool, ...]] = {
    "BatchNorm": (True, False, True, True, True, False),
    "WeightNorm": (True, False, True, False, False, False),
    "LayerNorm": (True, True, False, True, False, True),
    "RMSNorm": (True, False, False, True, False, True),
}
"""The published table: per method, True where it is invariant, in the column order
of `TRANSFORMS`."""
SOURCES = {
    "BatchNorm": "Ba et al. 2016, Table 1",
    "WeightNorm": "Ba et al. 2016, Table 1",
    "LayerNorm": "Ba et al. 2016, Table 1",
    "RMSNorm": "Zhang & Sennrich 2019, Table 1",
}
"""Where each row of `PAPER` is published."""

Layer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""A normalised layer: `h(x, W)` from inputs (N, I) and weights (H, I) to (N, H)."""


def _layers(g: np.ndarray, b: np.ndarray) -> dict[str, Layer]:
    """The four normalised layers h(x, W) with gain g and bias b, shape (H,)."""

    def batch(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        a = x @ w.T  # N,H
        h = a.shape[1]
        out, _ = batch_norm_forward(a, g, b, np.zeros(h), np.ones(h), True, eps=EPS)
        return out

    def weight(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return g * (x @ w.T) / np.linalg.norm(w, axis=1) + b  # N,H

    def layer(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        out, _ = layer_norm_forward(x @ w.T, g, b, eps=EPS)
        return out

    def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        out, _ = rms_norm_forward(x @ w.T, g, eps=EPS)
        return out + b

    return {"BatchNorm": batch, "WeightNorm": weight, "LayerNorm": layer, "RMSNorm": rms}


def _transforms(
    rng: np.random.Generator, n: int, i: int
) -> dict[str, Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]:
    delta = 3.7  # a positive scale (the tables concern positive rescaling)
    gamma_w = rng.standard_normal(i)  # I: added to every weight vector
    gamma_x = rng.standard_normal(i)  # I: added to every example
    case = np.ones((n, 1))
    case[0, 0] = 0.21  # one training case rescaled

    def one_row(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w2 = w.copy()
        w2[0] *= 5.3  # one weight vector rescaled
        return x, w2

    return {
        "weight matrix re-scaling": lambda x, w: (x, delta * w),
        "weight matrix re-centering": lambda x, w: (x, w + gamma_w),
        "weight vector re-scaling": one_row,
        "dataset re-scaling": lambda x, w: (delta * x, w),
        "dataset re-centering": lambda x, w: (x + gamma_x, w),
        "single training case re-scaling": lambda x, w: (case * x, w),
    }


def invariance_matrix(seed: int, n: int = 16, i: int = 12, h: int = 10) -> np.ndarray:
    """Max relative change of the outputs, shape (len(METHODS), len(TRANSFORMS)).

    Relative change = max |h' - h| / max |h| over the whole batch, in float64.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, i)) + 0.5  # N,I (a non-zero mean, so re-centering matters)
    w = rng.standard_normal((h, i))  # H,I
    g = rng.uniform(0.5, 2.0, h)  # H
    b = rng.standard_normal(h)  # H
    layers = _layers(g, b)
    transforms = _transforms(rng, n, i)
    change = np.empty((len(METHODS), len(TRANSFORMS)))
    for r, method in enumerate(METHODS):
        base = layers[method](x, w)  # N,H
        for c, name in enumerate(TRANSFORMS):
            x2, w2 = transforms[name](x, w)
            new = layers[method](x2, w2)
            change[r, c] = np.max(np.abs(new - base)) / np.max(np.abs(base))
    return change


def _word(value: float) -> str:
    if value <= INVARIANT_TOL:
        return "Invariant"
    return "No" if value > CHANGED_TOL else "undecided"


def _figure(change: np.ndarray) -> object:
    fig, ax = new_figure(width=8.5, height=3.8)
    logs = np.log10(np.maximum(change, 1e-17))
    image = ax.imshow(logs, cmap="viridis", vmin=-17, vmax=1, aspect="auto")
    ax.set_xticks(range(len(TRANSFORMS)), [t.replace(" ", "\n", 2) for t in TRANSFORMS])
    ax.set_yticks(range(len(METHODS)), METHODS)
    for r in range(len(METHODS)):
        for c in range(len(TRANSFORMS)):
            color = "k" if change[r, c] > CHANGED_TOL else "w"  # readable on yellow / purple
            ax.text(c, r, _word(change[r, c]), ha="center", va="center", color=color, fontsize=9)
    fig.colorbar(image, ax=ax, label="log10 max relative change of the output")
    ax.set_title("Invariance of normalised layers (float64; invariant: change <= 1e-12)")
    ax.tick_params(axis="x", labelsize=8)
    return fig


def _checks(change: np.ndarray) -> tuple[list[list[str]], list[Check]]:
    """Table rows and one check per method: every cell as the paper says."""
    rows, checks = [], []
    for r, method in enumerate(METHODS):
        words = [_word(v) for v in change[r]]
        expected = ["Invariant" if inv else "No" for inv in PAPER[method]]
        cells = [w if w == e else f"{w} (paper: {e})" for w, e in zip(words, expected, strict=True)]
        rows.append([method, *cells])
        agree = sum(w == e for w, e in zip(words, expected, strict=True))
        paper_row = ", ".join(f"{t}: {e}" for t, e in zip(TRANSFORMS, expected, strict=True))
        checks.append(
            Check(
                SOURCES[method],
                f"{method}: {paper_row}",
                f"each of the 6 cells as in the paper: invariant = relative change <= "
                f"{INVARIANT_TOL:g}, not invariant = change > {CHANGED_TOL:g} (float64)",
                f"{agree}/6 cells agree; changes " + ", ".join(f"{v:.1e}" for v in change[r]),
                agree == len(TRANSFORMS),
                {"relative_change": change[r].tolist(), "measured": words, "paper": expected},
            )
        )
    return rows, checks


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Compute the invariance table and compare every cell with the papers."""
    progress.start(1, "invariance table")
    change = invariance_matrix(settings.seed)
    progress.advance()
    rows, checks = _checks(change)
    return ExperimentResult(
        name=NAME,
        title=TITLE,
        seed=settings.seed,
        summary=(
            "The table of Ba et al. 2016 recomputed exactly in float64: each cell applies "
            "one transformation to the weights or the data and measures how much the "
            "normalised layer's output h = g * norm(x W^T) + b changes. RMSNorm (Zhang & "
            "Sennrich 2019) keeps LayerNorm's re-scaling invariances but loses re-centering."
        ),
        checks=checks,
        figures={"table": _figure(change)},
        tables=[markdown_table(["method", *TRANSFORMS], rows)],
        metrics={
            "relative_change": {
                m: dict(zip(TRANSFORMS, change[r].tolist(), strict=True))
                for r, m in enumerate(METHODS)
            }
        },
        settings={"examples": 16, "inputs": 12, "hidden": 10, "eps": EPS, "dtype": "float64"},
    )



@on_references
def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the experiment (see the module docstring) on the NumPy references, one thread."""
    return _run(settings, progress)
