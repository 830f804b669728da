"""Figure of :mod:`normlab.lab.experiments.residual_depth`: update and output change vs depth."""

from __future__ import annotations

import numpy as np

from normlab.lab.plotting import new_figure

__all__ = ["residual_figures"]

# one colour, marker and dash per placement, so lines drawn on top of each other stay apart
STYLE = {
    "post": ("C3", "o", "-"),
    "deepnorm": ("C2", "s", "--"),
    "admin": ("C1", "^", "-."),
    "pre": ("C0", "D", ":"),
    "sandwich": ("C4", "v", "--"),
    "rezero": ("C7", "x", ":"),
}


def residual_figures(
    depths: tuple[int, ...], update: dict[str, np.ndarray], change: dict[str, np.ndarray],
    extension: dict[str, np.ndarray],
) -> dict:
    """One figure, three log-log panels: ||ΔF|| after one SGD step (weight matrices), after
    one AdamW step (every parameter, the extension), E||ΔF||²/C under perturbation."""
    fig, (ax1, ax3, ax2) = new_figure(1, 3, width=4.6, height=4.2)
    xs = np.array(depths)
    for name in update:
        color, marker, dash = STYLE[name]
        kw = {"color": color, "marker": marker, "linestyle": dash, "label": name}
        if np.all(update[name] > 0):  # ReZero's SGD update is exactly 0 at init
            ax1.loglog(xs, update[name], **kw)
        ax3.loglog(xs, extension[name], **kw)
        if np.all(change[name] > 0):  # ReZero is exactly 0 at init: nothing to draw
            ax2.loglog(xs, change[name], **kw)
    ref = change["post"][0] * xs / xs[0]
    ax2.loglog(xs, ref, "k", lw=0.8, alpha=0.5, label="∝ N")
    ax2.loglog(xs, change["pre"][0] * np.log(xs) / np.log(xs[0]), "k", lw=0.8, alpha=0.5,
               linestyle=(0, (1, 3)), label="∝ ln N")  # fmt: skip
    ax1.set(xlabel="layers N", ylabel="RMS over tokens of ||ΔF_t||",
            title="One SGD step, weight matrices (judged)")  # fmt: skip
    ax3.set(xlabel="layers N", ylabel="RMS over tokens of ||ΔF_t||",
            title="One AdamW step, all parameters (shown)")  # fmt: skip
    ax2.set(xlabel="layers N", ylabel="E||F(W*) - F(W)||² / C",
            title="Output change under weight perturbation")  # fmt: skip
    for ax in (ax1, ax3, ax2):
        ax.set_xticks(xs, [str(v) for v in depths])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    return {"depth": fig}
