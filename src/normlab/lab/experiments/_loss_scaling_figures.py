"""Figures of the loss_scaling experiment (histogram, flushed fraction, training curves)."""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure

__all__ = ["plot_flush", "plot_histogram", "plot_training"]

_F16_NORMAL, _F16_MAX = 2.0**-14, 65504.0


def plot_histogram(g: np.ndarray, scale: float) -> Any:
    """Histogram of log2 |g| (Figure 3) with fp16's bands, before and after scaling by S."""
    fig, ax = new_figure(width=7.0, height=5.0)
    nz = np.abs(g[g != 0]).astype(np.float64)
    bins = np.arange(np.floor(np.log2(nz.min())) - 1, np.log2(nz.max() * scale) + 2, 0.5)
    ax.hist(np.log2(nz), bins=bins, color="tab:blue", alpha=0.8, label="|g| (fp32 run)")
    ax.hist(np.log2(nz * scale), bins=bins, histtype="step", color="tab:purple", lw=1.5,
            label=f"|g| * S, S = 2^{int(np.log2(scale))} (the dynamic scaler's median)")
    ax.axvspan(bins[0], -25, color="tab:red", alpha=0.15, label="flushed to 0 in fp16 (<= 2^-25)")
    ax.axvspan(-25, np.log2(_F16_NORMAL), color="tab:orange", alpha=0.15,
               label="fp16 subnormals (2^-24 ... 2^-14)")
    ax.axvspan(np.log2(_F16_NORMAL), np.log2(_F16_MAX), color="tab:green", alpha=0.1,
               label="fp16 normals (2^-14 ... 65504)")
    ax.set(xlabel="log2 |gradient value|", ylabel="count (nonzero values)",
           title="Backward signals during fp32 training (every 10th step)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return fig

def plot_flush(exponents: tuple[int, ...], flushed: np.ndarray, overflow: np.ndarray) -> Any:
    """Flushed and overflowing fractions against the loss scale S = 2^e."""
    fig, ax = new_figure()
    s = 2.0 ** np.array(exponents)
    ax.plot(s, 100 * flushed, marker="o", label="flushed to zero")
    ax.plot(s, 100 * overflow, marker="s", ls="--", label="overflow to inf")
    ax.set(xlabel="loss scale S", ylabel="% of nonzero gradients",
           title="fp16 fate of the gradients g * S")
    ax.set_xscale("log", base=2)
    ax.legend()
    return fig

def plot_training(runs: dict[str, dict[str, Any]]) -> Any:
    """Loss curves of the three runs (told apart by width and dashes) and the scale trace."""
    fig, (ax0, ax1) = new_figure(1, 2)
    styles: dict[str, dict[str, Any]] = {"fp32": {"lw": 3.0, "alpha": 0.5, "color": "k"},
              "fp16": {"ls": "-", "color": "tab:red"},
              "fp16+scaler": {"ls": "--", "color": "tab:purple", "marker": "o", "ms": 3}}
    for mode, out in runs.items():
        ax0.plot(np.arange(out["loss"].size), out["loss"], label=mode, markevery=0.1,
                 **styles[mode])
    ax0.set(yscale="log", xlabel="step", ylabel="training loss (MSE)",
            title="Training loss (fp16+scaler drawn over fp32)")
    ax0.legend()
    tr = runs["fp16+scaler"]["scale"]
    ax1.plot(np.arange(1, tr.size + 1), tr, color="tab:purple")
    ax1.set(xlabel="step", ylabel="loss scale S", title="Dynamic loss scale trace")
    ax1.set_yscale("log", base=2)
    return fig
