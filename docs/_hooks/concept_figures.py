"""Draw the concept pages' figures that the lab does not: format bit layouts, block scaling.

    python docs/_hooks/concept_figures.py

writes `docs/figures/concept-format_layouts.png` and `docs/figures/concept-block_scaling.png`
(needs matplotlib, the `docs` extra). Every number in them comes from normlab: the field
widths from the named formats, the blocks from `mx_quantize` and `nvfp4_quantize` on a
fixed vector. The concept pages also show figures of the committed lab report
(`docs/lab/report/figures/`), which `normlab report --out docs/lab/report` redraws.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
OUT = ROOT / "docs" / "figures"

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from normlab.precision import (  # noqa: E402
    BFLOAT16,
    FLOAT4_E2M1FN,
    FLOAT6_E2M3FN,
    FLOAT6_E3M2FN,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT8_E8M0FNU,
    FLOAT16,
    FLOAT32,
    mx_quantize,
    nvfp4_quantize,
)

COLOURS = {"sign": "#d95f02", "exponent": "#1b9e77", "mantissa": "#7570b3"}
LAYOUTS = [
    ("fp32", FLOAT32), ("bf16", BFLOAT16), ("fp16", FLOAT16), ("fp8 E4M3", FLOAT8_E4M3FN),
    ("fp8 E5M2", FLOAT8_E5M2), ("fp6 E3M2", FLOAT6_E3M2FN), ("fp6 E2M3", FLOAT6_E2M3FN),
    ("fp4 E2M1", FLOAT4_E2M1FN), ("E8M0 scale", FLOAT8_E8M0FNU),
]  # fmt: skip


def format_layouts(path: Path) -> None:
    """One row of bit boxes per format: sign, exponent, mantissa; max value on the right."""
    fig, ax = plt.subplots(figsize=(8.0, 4.2), dpi=110)
    for row, (label, fmt) in enumerate(LAYOUTS):
        y = len(LAYOUTS) - 1 - row
        fields = [("sign", int(fmt.signed)), ("exponent", fmt.exponent_bits),
                  ("mantissa", fmt.mantissa_bits)]  # fmt: skip
        x = 0
        for kind, width in fields:
            for _ in range(width):
                ax.add_patch(plt.Rectangle((x, y + 0.1), 0.9, 0.8, color=COLOURS[kind]))
                x += 1
        ax.text(-0.6, y + 0.5, label, ha="right", va="center", fontsize=9)
        ax.text(33.5, y + 0.5, f"max {fmt.max:.4g}", ha="left", va="center", fontsize=8)
    for kind, colour in COLOURS.items():
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=colour, label=kind))
    ax.set_xlim(-9, 41)
    ax.set_ylim(-0.2, len(LAYOUTS) + 0.6)
    ax.axis("off")
    ax.legend(loc="upper right", ncol=3, fontsize=8, frameon=False)
    ax.set_title("Bits of each format: sign, exponent, mantissa (one box per bit)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def block_scaling(path: Path) -> None:
    """A vector with one outlier per block: MXFP8 (32 per E8M0 scale) and NVFP4 (16 per E4M3
    scale, one float32 scale per tensor), quantised and dequantised by normlab."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32)
    x[[5, 40]] = [12.0, -30.0]  # an outlier in two of the blocks
    mx = mx_quantize(x, "fp4", block_size=32)
    nv = nvfp4_quantize(x)
    mx_scales = np.repeat(mx.scales, 32)
    nv_scales = np.repeat(nv.block_scales * nv.tensor_scale, 16)
    idx = np.arange(x.size)
    fig, axes = plt.subplots(2, 1, figsize=(8.0, 5.4), dpi=110, sharex=True)
    for ax, name, deq, scales, block in (
        (axes[0], "MXFP4: E2M1 elements, one E8M0 (power-of-two) scale per 32",
         mx.dequantize(), mx_scales, 32),
        (axes[1], "NVFP4: E2M1 elements, one E4M3 scale per 16, one float32 scale per tensor",
         nv.dequantize(), nv_scales, 16),
    ):  # fmt: skip
        ax.plot(idx, x, "o", ms=3, color="0.55", label="input")
        ax.plot(idx, deq, "x", ms=4, color="#d95f02", label="quantised")
        ax.step(idx, 6.0 * scales, where="mid", color="#1b9e77", lw=1,
                label="6 x block scale (largest element)")
        ax.step(idx, -6.0 * scales, where="mid", color="#1b9e77", lw=1)
        for edge in range(block, x.size, block):
            ax.axvline(edge - 0.5, color="0.8", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("value")
        err = float(np.abs(deq - x).mean())
        ax.text(0.99, 0.04, f"mean |error| {err:.3f}", transform=ax.transAxes, ha="right",
                fontsize=8)
    axes[0].legend(fontsize=7, loc="lower left", ncol=3)
    axes[1].set_xlabel("element (blocks separated by grey lines)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    """Draw both figures into docs/figures/."""
    OUT.mkdir(parents=True, exist_ok=True)
    format_layouts(OUT / "concept-format_layouts.png")
    block_scaling(OUT / "concept-block_scaling.png")
    print(f"wrote {OUT / 'concept-format_layouts.png'} and {OUT / 'concept-block_scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
