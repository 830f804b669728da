"""Figures of experiment 1 ([normlab.lab.experiments.xiong_init][]): Lemma 2 and Theorem 1."""

from __future__ import annotations

import numpy as np

from normlab.lab._deps import require
from normlab.lab.plotting import new_figure

__all__ = ["xiong_figures"]


def _slope(depths: tuple[int, ...], values: np.ndarray) -> float:
    return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def xiong_figures(
    d_lemma: int,
    lemma: dict[str, np.ndarray],
    d_thm: int,
    grads: dict[str, np.ndarray],
    depths: tuple[int, ...],
    band: tuple[float, float],
) -> dict:
    """Two figures: Lemma 2's norms per layer, Theorem 1's gradient vs depth (log-log).

    `lemma[placement]` has shape (seeds, layers), `grads[placement]` (seeds, depths);
    `band` = (target, tolerance) of the Post-LN check, drawn as a shaded band.
    """
    layers = np.arange(1, lemma["post"].shape[1] + 1)
    fig1, ax = new_figure(width=6.8, height=4.4)
    for placement, label, color in (("post", "Post-LN: ||x^{post,5}_l||²/d", "C3"),
                                    ("pre", "Pre-LN: ||x_l||²/d", "C0")):  # fmt: skip
        mean = lemma[placement].mean(axis=0)
        ax.plot(layers, mean, "o-", color=color, label=label)
        ax.fill_between(
            layers, lemma[placement].min(axis=0), lemma[placement].max(axis=0),
            color=color, alpha=0.2,
        )  # fmt: skip
    ax.plot(layers, 1 + layers / 2, "k--", lw=1, label="Lemma 2 bounds (1 + l/2, 1 + 3l/2)")
    ax.plot(layers, 1 + 3 * layers / 2, "k--", lw=1)
    ax.axhspan(band[0] - band[1], band[0] + band[1], color="C3", alpha=0.1)
    ax.set(
        xlabel="layer l",
        ylabel="squared norm / d (dimensionless)",
        title=f"Lemma 2 at initialization (d = {d_lemma}, "
        f"{lemma['post'].shape[0]} seeds; band = min..max over seeds)",
    )
    ax.legend(fontsize=8)
    fig2, ax2 = new_figure(width=6.8, height=4.4)
    xs = np.array(depths)
    for placement, label, color in (("post", "Post-LN", "C3"), ("pre", "Pre-LN", "C0")):
        g = grads[placement].mean(axis=0)
        slope = _slope(depths, g)
        ax2.loglog(xs, g, "o-", color=color, label=f"{label} (slope {slope:+.2f})")
    ref = grads["pre"].mean(axis=0)[0] * (xs / xs[0]) ** -0.5
    ax2.loglog(xs, ref, "k:", lw=1, label="L^(-1/2) reference")
    ax2.set(
        xlabel="number of layers L",
        ylabel="per-token ||dLoss_t/dW^{2,L}||_F (RMS over tokens)",
        title=f"Theorem 1: gradient of the last FFN weight (d = {d_thm})",
    )
    ax2.set_xticks(xs, [str(v) for v in depths])
    ax2.minorticks_off()
    ticker = require("matplotlib.ticker")
    ax2.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax2.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax2.legend(fontsize=8)
    return {"lemma2": fig1, "theorem1": fig2}
