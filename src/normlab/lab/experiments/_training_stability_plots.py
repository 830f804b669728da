"""Figures of `normlab.lab.experiments.training_stability`: loss curves and the lr sweep."""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure
from normlab.lab.training import TrainLog

__all__ = ["label", "plot_curves", "plot_sweep"]


def label(placement: str, warmup: bool) -> str:
    """"Post-LN, warmup" and the like."""
    return f"{'Post' if placement == 'post' else 'Pre'}-LN, {'warmup' if warmup else 'no warmup'}"


def _smooth(curve: np.ndarray, width: int = 10) -> np.ndarray:
    """Moving average over `width` steps (NaN after a divergence stays NaN)."""
    kernel = np.ones(width) / width
    return np.convolve(curve, kernel, mode="valid")


_COLORS = {("post", False): "tab:red", ("post", True): "tab:orange",
           ("pre", False): "tab:blue", ("pre", True): "tab:cyan"}
_LINES = {("post", False): ("-", "o"), ("post", True): ("--", "s"),
          ("pre", False): (":", "^"), ("pre", True): ("-.", "v")}


def plot_curves(logs: dict[tuple[str, bool], list[TrainLog]], entropy: float,
                peak_lr: float) -> Any:
    """Training-loss curves of every run at the multi-seed lr (first seed bold)."""
    fig, ax = new_figure(width=7.5, height=4.6)
    for key, runs in logs.items():
        for i, log in enumerate(runs):
            curve = _smooth(np.asarray(log.train_loss))
            first = i == 0
            ax.plot(np.arange(curve.size) + 10, curve, color=_COLORS[key], ls=_LINES[key][0],
                    alpha=1.0 if first else 0.35, lw=1.6 if first else 0.9,
                    label=label(*key) if first else None)
    ax.axhline(entropy, color="k", ls=":", label=f"unigram entropy {entropy:.2f}")
    ax.set(xlabel="step", ylabel="training loss (nats per character, 10-step mean)",
           title=f"Character LM, AdamW peak lr {peak_lr:g} (faint lines: other seeds)")
    ax.legend(fontsize=8)
    return fig


def plot_sweep(sweep: dict[tuple[str, bool], dict[float, float]], entropy: float,
               peak_lr: float) -> Any:
    """Validation loss against the peak lr (run 0), diverged runs drawn on a line above."""
    fig, ax = new_figure(width=7.0, height=4.4)
    top = entropy + 0.3  # where a diverged run is drawn
    for key, by_lr in sweep.items():
        lrs = np.array(list(by_lr))
        v = np.array([min(x, top) for x in by_lr.values()])
        ls, marker = _LINES[key]
        ax.plot(lrs, v, color=_COLORS[key], ls=ls, marker=marker, label=label(*key))
    ax.axhline(entropy, color="k", ls=":", label=f"unigram entropy {entropy:.2f}")
    ax.axhline(top, color="0.6", ls="-", lw=0.8, label="diverged (drawn here)")
    ax.axvline(peak_lr, color="0.6", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="AdamW peak learning rate", ylabel="validation loss (nats)",
           title="Learning-rate sweep (seed run 0; dashed line: the multi-seed lr)")
    ax.legend(fontsize=8)
    return fig
