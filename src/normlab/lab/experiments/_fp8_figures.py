"""Figures of the fp8_formats experiment (the scale sweep and the drifting tensor)."""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure

__all__ = ["plot_drift", "plot_sweep"]


def plot_sweep(log2_scales: np.ndarray, sweep: dict[str, np.ndarray]) -> Any:
    """Relative error against the tensor's scale, cast and per-tensor scaled, both formats."""
    fig, ax = new_figure(width=7.0)
    styles = {"E4M3": ("tab:blue", "-"), "E5M2": ("tab:orange", "-"),
              "E4M3 scaled": ("tab:blue", ":"), "E5M2 scaled": ("tab:orange", ":")}
    for name, err in sweep.items():
        color, ls = styles[name]
        label = f"{name[:4]}, per-tensor current scaling" if "scaled" in name else f"{name}, cast"
        ax.plot(2.0**log2_scales, err, color=color, ls=ls, label=label,
                marker="o" if "scaled" in name else None, markevery=8, ms=3)
    ax.set(xscale="log", yscale="log", ylim=(1e-2, 1.5), xlabel="tensor standard deviation s",
           ylabel="relative RMS error", title="Casting N(0, s^2) to FP8 (saturating)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    return fig

def plot_drift(log2_s: np.ndarray, drift: dict[str, np.ndarray], history: int,
               e4m3_max: float) -> Any:
    """Current vs delayed scaling on the drifting tensor, its scale and saturation."""
    fig, (ax0, ax1) = new_figure(1, 2)
    steps = np.arange(log2_s.size)
    ax0.plot(steps, drift["current"], ls="-", label="current scaling (own amax)")
    ax0.plot(steps, drift["delayed"], ls="--", marker=".",
             label=f"delayed scaling (history {history}, max)")
    ax0.set(yscale="log", xlabel="step", ylabel="relative RMS error (E4M3)",
            title="A tensor whose range drifts upwards")
    ax0.legend(fontsize=8)
    ax1.plot(steps, 2.0**log2_s, color="k", label="tensor std")
    ax1.set(yscale="log", xlabel="step", ylabel="tensor standard deviation",
            title="Scale drift and saturation")
    twin = ax1.twinx()
    twin.plot(steps, 100 * drift["saturated"], color="tab:red", label="saturated (delayed)")
    twin.set_ylabel(f"% of values saturated at {e4m3_max:g} (delayed)")
    ax1.legend(loc="upper left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    return fig
