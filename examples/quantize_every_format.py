"""Quantize one tensor to every named format and plot the relative error against magnitude.

Values spread log-uniformly over 2^-30 .. 2^20 (both signs) are rounded to nearest-even in
each format of `normlab.precision.NAMED_FORMATS` (the unsigned E8M0 scale format gets the
magnitudes). The plot shows each format's window: flat relative error `~2^-(M+1)` inside
its normal range, growing through the subnormals, 100% where values flush to zero, and
overflow (inf, NaN or the clipped maximum with `saturate=True`) above its maximum.

Run: `python examples/quantize_every_format.py [OUT.png]` (default
`quantize_error.png` in the current folder); prints one line per format and checks every
format's median relative error in its normal range against half the gap, `2^-(M+1)`, the
largest error round-to-nearest can make relative to a value in `[1, 2) * 2^e`.
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from normlab.precision import NAMED_FORMATS, quantize


def main(out: str = "quantize_error.png") -> None:
    rng = np.random.default_rng(0)
    magnitude = np.exp2(rng.uniform(-30, 20, 50_000))  # N
    x = (magnitude * rng.choice([-1.0, 1.0], magnitude.size)).astype(np.float32)  # N
    order = np.argsort(magnitude)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for fmt in NAMED_FORMATS:
        values = x if fmt.signed else np.abs(x)  # E8M0 has no sign bit
        with np.errstate(over="ignore", invalid="ignore"):
            q = quantize(values, fmt, saturate=True).astype(np.float64)
            rel = np.abs(q - values) / np.abs(values)  # N
        normal = (np.abs(values) >= fmt.min_normal) & (np.abs(values) <= fmt.max)
        median = float(np.median(rel[normal]))
        print(f"{fmt.name:16s} E{fmt.exponent_bits}M{fmt.mantissa_bits:<3d} "
              f"median relative error in the normal range {median:.2e}")  # fmt: skip
        if fmt.mantissa_bits > 0:
            assert median <= 2.0 ** -(fmt.mantissa_bits + 1), fmt.name
        smooth = np.convolve(rel[order], np.ones(201) / 201, mode="same")  # running mean
        ax.plot(magnitude[order], np.minimum(smooth, 1.0), label=fmt.name, lw=1.2)
    ax.set(xscale="log", yscale="log", xlabel="|x|", ylabel="relative error (running mean)",
           title="Round-to-nearest-even into every format (saturating)")  # fmt: skip
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
