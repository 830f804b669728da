"""Experiment: LayerNorm statistics of float32 rows with a large offset (two-pass vs naive).

Chan, Golub & LeVeque 1983 ("Algorithms for computing the sample variance: analysis and
recommendations"): the textbook one-pass formula var = E[x^2] - E[x]^2 subtracts two
numbers of size mean^2 to get one of size var, so its relative error grows like
u (mean^2 / var) (u the unit roundoff; the condition number squared); the corrected
two-pass algorithm (mean, then the centred sum of squares, then the correction of the
first mean by the centred sum) has error of order u, whatever the offset. normlab's
design requires it of every norm ("never the cancelling E[x^2] - E[x]^2"), in the NumPy
statistics helper and in the fused kernel alike.

Setup: R rows of W = 4096 float32 values `randn + 2000` (mean^2 / var = 4e6, so the
naive formula in float32, u = 6e-8, has nothing left), normalised by
`layer_norm_forward` once with the NumPy reference and once with the kernel (when numba
is installed; otherwise the reference runs twice), and by the naive formula written here.
Everything is compared with float64 statistics of the same float32 values. A sweep over
offsets 0 ... 10^4 shows how each error grows. Dimension letters: R rows, W width.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from normlab import layer_norm_forward
from normlab._backend import use_backend
from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import single_threaded

__all__ = ["DETECTS", "NAME", "OFFSETS", "TITLE", "checks", "measure", "naive_stats", "run"]

NAME = "stats_precision"
TITLE = "LayerNorm statistics of float32 rows with a large offset (Chan, Golub & LeVeque 1983)"
DETECTS = (
    "variance as E[x^2] - E[x]^2 in float32 in the NumPy reference",
    "variance as E[x^2] - E[x]^2 in float32 in the fused kernel",
)
WIDTH = 4096
"""Features per row (W)."""
OFFSET = 2000.0
"""The offset added to every standard normal row of the judged checks."""
EPS = 1e-5
"""LayerNorm's eps, in every method compared."""
OFFSETS = (0.0, 10.0, 100.0, 1000.0, 2000.0, 10000.0)  # the sweep of the figure
"""The offsets of the figure's sweep."""
_ULP = float(np.spacing(np.float32(OFFSET)))  # 2^-13: one float32 ulp of the offset
_OUT_TOL = _ULP  # two-pass: output within one ulp of the offset (in units of sigma = 1)
_VAR_TOL = 1e-5  # two-pass: relative variance error (about 170 u; measured ~4 u)
_NAIVE_MIN = 1e-2  # the naive formula must visibly fail on these rows (the setup is hard)


def naive_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and E[x^2] - E[x]^2 of each row, in x's dtype: the formula to avoid (R, R)."""
    mean = np.mean(x, axis=-1)  # R
    return mean, np.maximum(np.mean(x * x, axis=-1) - mean * mean, 0)


def _errors(x: np.ndarray, out: np.ndarray, var: np.ndarray) -> dict[str, float]:
    """Max |out - out64| and max relative variance error against float64 (same inputs)."""
    x64 = x.astype(np.float64)  # R,W
    mean64, var64 = x64.mean(axis=-1, keepdims=True), x64.var(axis=-1, keepdims=True)
    out64 = (x64 - mean64) / np.sqrt(var64 + EPS)  # R,W
    return {
        "out": float(np.max(np.abs(out.astype(np.float64) - out64))),
        "var": float(np.max(np.abs(var.astype(np.float64) - var64[:, 0]) / var64[:, 0])),
    }


def _methods(x: np.ndarray, kernel: bool) -> dict[str, dict[str, float]]:
    """Errors of the reference, the kernel and the naive formula on rows `x` (R,W)."""
    found = {}
    for label, name in (("reference", "numpy"), ("kernel", "numba" if kernel else "numpy")):
        with use_backend(name):
            out, cache = layer_norm_forward(x, None, None, EPS)  # R,W
        rstd = cache.rstd.astype(np.float64)  # R
        found[label] = _errors(x, out, 1.0 / rstd**2 - EPS)
    mean, var = naive_stats(x)
    out = (x - mean[:, None]) / np.sqrt(var[:, None] + np.float32(EPS))
    found["naive"] = _errors(x, out, var)
    return found


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Errors at the offset 2000, and along the offset sweep."""
    rows = settings.pick(32, 128, 512)
    kernel = importlib.util.find_spec("numba") is not None
    rng = np.random.default_rng([settings.seed, 11])
    z = rng.standard_normal((rows, WIDTH)).astype(np.float32)  # R,W
    progress.start(len(OFFSETS) + 1, "statistics precision")
    main = _methods(z + np.float32(OFFSET), kernel)
    progress.advance()
    sweep = []
    for offset in OFFSETS:
        sweep.append(_methods(z + np.float32(offset), kernel))
        progress.advance()
    return {"rows": rows, "kernel": kernel, "main": main, "sweep": sweep}


def checks(m: dict[str, Any]) -> list[Check]:
    """The naive formula fails on these rows; the reference and the kernel do not."""
    src = "Chan, Golub & LeVeque 1983; normlab design (statistics)"
    naive, found = m["main"]["naive"], []
    found.append(Check(
        source="Chan, Golub & LeVeque 1983",
        claim="E[x^2] - E[x]^2 in float32 loses the variance of rows whose mean is large "
        "against their spread (relative error ~ u mean^2 / var).",
        criterion=f"naive variance relative error >= {_NAIVE_MIN:g} on randn + {OFFSET:g} rows",
        measured=f"relative variance error {naive['var']:.3g}, output error {naive['out']:.3g}",
        passed=bool(naive["var"] >= _NAIVE_MIN),
        values=dict(naive),
    ))
    for label in ("reference", "kernel"):
        e = m["main"][label]
        what = "NumPy reference" if label == "reference" else (
            "fused kernel" if m["kernel"] else "fused kernel (numba missing: the reference)")
        found.append(Check(
            source=src,
            claim=f"The corrected two-pass statistics ({what}) keep such rows to the "
            "precision of the input.",
            criterion=f"output within {_OUT_TOL:.3g} (one float32 ulp of {OFFSET:g}) of float64 "
            f"and variance relative error <= {_VAR_TOL:g}",
            measured=f"output error {e['out']:.3g}, variance error {e['var']:.3g}",
            passed=bool(e["out"] <= _OUT_TOL and e["var"] <= _VAR_TOL),
            values=dict(e),
        ))
    return found


def tables(m: dict[str, Any]) -> list[str]:
    """Variance and output errors of each method along the offset sweep."""
    header = ["offset", *(f"{k}: var / out error" for k in ("naive", "reference", "kernel"))]
    rows = [[f"{o:g}", *(f"{s[k]['var']:.2g} / {s[k]['out']:.2g}"
                         for k in ("naive", "reference", "kernel"))]
            for o, s in zip(OFFSETS, m["sweep"], strict=True)]
    return [markdown_table(header, rows)]


def _plot(m: dict[str, Any]) -> Any:
    fig, ax = new_figure(width=6.8)
    styles = {"naive": ("tab:red", "-", "o"), "reference": ("tab:blue", "-", "s"),
              "kernel": ("tab:green", "--", "^")}
    x = np.array([max(o, 1.0) for o in OFFSETS])
    for label, (color, ls, marker) in styles.items():
        err = np.array([max(s[label]["var"], 1e-12) for s in m["sweep"]])
        ax.plot(x, err, color=color, ls=ls, marker=marker, label=f"{label} (float32)")
    ax.axhline(_VAR_TOL, color="k", ls=":", lw=1, label=f"criterion {_VAR_TOL:g}")
    ax.set(xscale="log", yscale="log", xlabel="row offset (mean; 1 stands for 0)",
           ylabel="max relative variance error vs float64",
           title=f"Rows randn + offset, width {WIDTH}")
    ax.legend(fontsize=8)
    return fig


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Measure the three statistics on offset rows and judge them (module docstring)."""
    with single_threaded():  # small work; one thread keeps the summation order fixed
        m = measure(settings, progress)
    summary = (
        f"{m['rows']} float32 rows of width {WIDTH}, each randn + {OFFSET:g}, normalised by "
        "`layer_norm_forward` (NumPy reference and "
        + ("fused kernel" if m["kernel"] else "reference again: numba is not installed")
        + ") and by the naive formula, all compared with float64 statistics of the same "
        "values. The table sweeps the offset."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks(m),
        figures={"offset_sweep": _plot(m)}, tables=tables(m),
        metrics={"at_offset": m["main"], "offsets": list(OFFSETS), "sweep": m["sweep"]},
        settings={"rows": m["rows"], "width": WIDTH, "offset": OFFSET, "eps": EPS,
                  "kernel": m["kernel"]},
    )
