"""Experiment 7: inverted dropout keeps the mean, adds variance x^2 p/(1-p), and eval is identity.

Srivastava et al. 2014 (JMLR 15), section 10 ("dropout ... scale the retained units by 1/p"
at train time, the "inverted" form the chapter's Listing 16.3 uses): with drop probability
p and keep probability q = 1 - p,

    out = m * x / q,   m ~ Bernoulli(q)   =>   E[out] = x,   Var[out] = x^2 p / q.

Many independent masks are drawn through [normlab.inverted_dropout][] for a fixed
vector x; the sample mean and variance of every coordinate are compared with x and
x^2 p/(1-p). Tolerances come from the sample size: a z-bound on the standard error of the
sample mean, sqrt(Var/N), and of the mean of (out - x)^2, sqrt((mu4 - sigma^4)/N), with the
exact fourth central moment mu4 = x^4 (p^4/q^3 + p) of the scaled Bernoulli. `nn.Dropout` in
eval mode, and p = 0, must return x unchanged (bitwise).

Shapes: N masks (samples), M coordinates of x.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab import inverted_dropout
from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import on_references
from normlab.nn import Dropout

__all__ = [
    "DETECTS",
    "NAME",
    "PROBABILITIES",
    "TITLE",
    "Z_BOUND",
    "checks",
    "dropout_moments",
    "exact_moments",
    "measure",
    "run",
    "tables",
]

DETECTS = ("inverted dropout without the 1/(1-p) rescaling of the kept units",)
NAME = "dropout_stats"
TITLE = "Inverted dropout: mean kept, variance x²p/(1-p), identity at eval (Srivastava 2014)"
PROBABILITIES = (0.1, 0.3, 0.5, 0.8)
"""The drop probabilities p measured."""
# |z| bound for every coordinate and every p: P(|Z| > 4.5) = 6.8e-6 per test, so about
# 2e-3 for the 4 x 64 x 2 tests of a default run (Bonferroni) - a true bug gives |z| >> 10.
Z_BOUND = 4.5
"""The largest |z| allowed for a coordinate's sample mean and variance (standard errors)."""
_M = 64  # coordinates of x


def exact_moments(x: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact Var[out] = x^2 p/(1-p) and 4th central moment x^4 (p^4/(1-p)^3 + p) of dropout(x).

    out takes x/(1-p) with probability 1-p and 0 with probability p; its deviation from the
    mean x is x p/(1-p) or -x.
    """
    q = 1.0 - p
    return x * x * p / q, x**4 * (p**4 / q**3 + p)


def dropout_moments(x: np.ndarray, p: float, n: int, rng: np.random.Generator) -> dict:
    """Sample mean/variance of `n` inverted-dropout draws of `x` and their z-scores.

    Returns a dict of arrays of shape (M,): `mean`, `var` = mean of (out - x)^2 (the
    variance about the known mean, unbiased), the exact
    `var_true` = x^2 p/(1-p), and `z_mean`, `z_var` (error / standard error).
    """
    xs = np.broadcast_to(x, (n, x.size))  # N,M
    out, _ = inverted_dropout(xs, p, rng)  # N,M
    mean = out.mean(axis=0)  # M
    var = np.mean((out - x) ** 2, axis=0)  # M: second moment about the known mean x
    var_true, mu4 = exact_moments(x, p)  # M, M
    se_mean = np.sqrt(var_true / n)  # M
    # standard error of a mean of n i.i.d. (out - x)^2; it is 0 at p = 1/2 (every draw gives
    # exactly x^2), so it is floored at the rounding bound of a float64 sum of n terms taken
    # in sequence, n * eps relative (a column mean of an (N, M) array is summed that way)
    rounding = n * np.finfo(np.float64).eps * var_true  # M
    se_var = np.maximum(np.sqrt(np.maximum(mu4 - var_true**2, 0.0) / n), rounding)  # M
    return {
        "mean": mean,
        "var": var,
        "var_true": var_true,
        "z_mean": (mean - x) / se_mean,
        "z_var": (var - var_true) / se_var,
    }


def _figure(x: np.ndarray, stats: dict[float, dict]) -> object:
    fig, (ax_m, ax_v) = new_figure(1, 2, width=5.2, height=4.2)
    for p, s in stats.items():
        ax_m.semilogx(np.abs(x), s["z_mean"], "o", ms=3.5, label=f"p = {p}")
        ax_v.loglog(s["var_true"], s["var"], "o", ms=3.5, label=f"p = {p}")
    for bound in (-Z_BOUND, Z_BOUND):
        ax_m.axhline(bound, color="k", ls="--", lw=1)
    ax_m.axhline(0.0, color="k", lw=0.8)
    ax_m.set(
        xlabel="|x| (input magnitude)",
        ylabel="(sample mean - x) / standard error",
        title=f"Mean is preserved (dashed: +-{Z_BOUND} standard errors)",
    )
    all_true = np.concatenate([s["var_true"] for s in stats.values()])
    vlim = [float(all_true.min()), float(all_true.max())]
    ax_v.plot(vlim, vlim, "k-", lw=1, label="Var = x² p/(1-p)")
    ax_v.set(
        xlabel="predicted variance x² p/(1-p)",
        ylabel="measured mean of (dropout(x) - x)²",
        title="Variance matches x² p/(1-p)",
    )
    ax_m.legend(fontsize=8)
    ax_v.legend(fontsize=8)
    fig.suptitle(f"Inverted dropout, {next(iter(stats.values()))['n']} masks per p")
    return fig


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Moments of many masks per p, and the eval/p = 0 identity."""
    n = settings.pick(4_000, 40_000, 200_000)
    rng = np.random.default_rng(settings.seed)
    progress.start(len(PROBABILITIES) + 1, "dropout moments")
    # x spans signs and three decades of magnitude; no zeros (their z-score is undefined)
    x = rng.choice([-1.0, 1.0], size=_M) * np.logspace(-1, 2, _M)  # M
    stats: dict[float, dict] = {}
    for p in PROBABILITIES:
        stats[p] = {**dropout_moments(x, p, n, rng), "n": n}
        progress.advance()
    layer = Dropout(0.5, np.random.default_rng(settings.seed + 1))
    layer.eval()
    x2 = rng.standard_normal((8, 16))  # B,D
    zero_p_out, _ = inverted_dropout(x2, 0.0, np.random.default_rng(0))
    progress.advance()
    return {
        "n": n, "x": x, "stats": stats,
        "z_mean": max(float(np.max(np.abs(s["z_mean"]))) for s in stats.values()),
        "z_var": max(float(np.max(np.abs(s["z_var"]))) for s in stats.values()),
        "eval_identity": bool(np.array_equal(layer(x2), x2) and np.array_equal(zero_p_out, x2)),
    }


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers `m`.

    See [measure][normlab.lab.experiments.dropout_stats.measure].
    """
    n, z_mean, z_var, eval_identity = m["n"], m["z_mean"], m["z_var"], m["eval_identity"]
    source = "Srivastava et al. 2014; chapter 16.2"
    return [
        Check(
            source,
            "Inverted dropout preserves the mean: E[dropout(x)] = x",
            f"every coordinate, every p in {list(PROBABILITIES)}: |mean - x| <= "
            f"{Z_BOUND} standard errors sqrt(x² p/(1-p)/N), N = {n}",
            f"max |z| = {z_mean:.2f}",
            z_mean <= Z_BOUND,
            {"max_abs_z_mean": z_mean, "n": n},
        ),
        Check(
            source,
            "Dropout adds variance x² p/(1-p) (Bernoulli mask scaled by 1/(1-p))",
            f"every coordinate, every p: |sample var - x² p/(1-p)| <= {Z_BOUND} standard "
            "errors sqrt((mu4 - sigma^4)/N) of the mean of (out - x)²",
            f"max |z| = {z_var:.2f}",
            z_var <= Z_BOUND,
            {"max_abs_z_var": z_var, "n": n},
        ),
        Check(
            "chapter 16.2 (inference uses the identity)",
            "In eval mode dropout is the identity; p = 0 changes nothing",
            "nn.Dropout(0.5).eval()(x) and inverted_dropout(x, 0) equal x bit for bit",
            "identical" if eval_identity else "different",
            eval_identity,
        ),
    ]


def tables(m: dict[str, Any]) -> list[str]:
    """Worst z-scores and variance error per p."""
    rows = [[p, f"{np.max(np.abs(s['z_mean'])):.2f}", f"{np.max(np.abs(s['z_var'])):.2f}",
             f"{np.max(np.abs(s['var'] / s['var_true'] - 1.0)):.3%}"]
            for p, s in m["stats"].items()]
    header = ["p", "max abs z (mean)", "max abs z (variance)", "max rel. error of variance"]
    return [markdown_table(header, rows)]


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Measure the moments of inverted dropout and check eval mode is the identity."""
    m = measure(settings, progress)
    return ExperimentResult(
        name=NAME,
        title=TITLE,
        seed=settings.seed,
        summary=(
            f"{m['n']} independent masks of `normlab.inverted_dropout` applied to a fixed "
            f"vector of {_M} values spanning 0.1 to 100 in magnitude, for each drop "
            "probability p. Each coordinate's sample mean and variance is compared with the "
            "exact moments of the scaled Bernoulli; errors are reported in standard errors (z)."
        ),
        checks=checks(m),
        figures={"moments": _figure(m["x"], m["stats"])},
        tables=tables(m),
        metrics={
            "max_abs_z_mean": m["z_mean"],
            "max_abs_z_var": m["z_var"],
            "per_p": {
                str(p): {
                    "max_abs_z_mean": float(np.max(np.abs(s["z_mean"]))),
                    "max_abs_z_var": float(np.max(np.abs(s["z_var"]))),
                }
                for p, s in m["stats"].items()
            },
            "eval_identity": m["eval_identity"],
        },
        settings={"masks_per_p": m["n"], "coordinates": _M, "p": list(PROBABILITIES)},
    )


@on_references
def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the experiment (see the module docstring) on the NumPy references, one thread."""
    return _run(settings, progress)
