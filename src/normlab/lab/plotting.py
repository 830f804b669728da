"""Figures for the report: matplotlib without pyplot (the Agg canvas, no global state).

Experiments build figures with [new_figure][normlab.lab.plotting.new_figure]; the report engine
turns them into PNG bytes with [figure_png][normlab.lab.plotting.figure_png]. Nothing here
touches `matplotlib.pyplot` so running the lab never opens a window nor changes a user's
backend.
"""

from __future__ import annotations

import io
from typing import Any

from normlab.lab._deps import require

__all__ = ["figure_png", "new_figure"]


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 6.4, height: float = 4.2) -> Any:
    """A matplotlib `Figure` on the Agg canvas and its axes (`fig, axes = new_figure()`).

    `axes` is one Axes for a 1x1 grid, else a numpy array of Axes (as `Figure.subplots`).
    """
    figure_mod = require("matplotlib.figure")
    backend_agg = require("matplotlib.backends.backend_agg")
    fig = figure_mod.Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    backend_agg.FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols)
    return fig, axes


def figure_png(fig: Any, *, dpi: int = 110) -> bytes:
    """The figure rendered as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
