"""FP8 delayed scaling on a linear layer, as Transformer Engine does it, beside current scaling.

The layer computes `y = x @ W.T` with both operands cast to E4M3 (the forward format of the
HYBRID recipe). Under delayed scaling each operand has an `Fp8Meta`: the scale used at step
t comes from the amax history of earlier steps, and this step's amax is recorded for the next
(`meta.quantize` then `meta.update`). Current scaling computes the scale from the tensor
itself. The input grows 1.5x per step, so the delayed scale lags: the largest scaled values
fall beyond E4M3's 448 and are clipped (the recipe saturates, as Transformer Engine's casts do).

Run: `python examples/fp8_delayed_scaling.py`; prints the relative error of both recipes
per step and checks that current scaling never clips while delayed scaling does, and pays for
it in error.
"""

from __future__ import annotations

import numpy as np

from normlab.precision import DelayedScaling, Fp8Meta, quantize_current_scaling

STEPS, BATCH, D_IN, D_OUT, GROWTH = 12, 32, 64, 32, 1.5
E4M3_MAX = 448.0


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def main() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((D_OUT, D_IN)) * 0.1).astype(np.float32)  # D_OUT, D_IN
    recipe = DelayedScaling(margin=0, amax_history_len=4, amax_compute_algo="max")
    x_meta, w_meta = Fp8Meta(recipe), Fp8Meta(recipe)  # one state per tensor
    errors = []
    print("step  input amax   delayed: scale  clipped  rel.err   current: scale  rel.err")
    for step in range(STEPS):
        x = (rng.standard_normal((BATCH, D_IN)) * GROWTH**step).astype(np.float32)  # B, D_IN
        exact = x.astype(np.float64) @ w.T.astype(np.float64)  # B, D_OUT

        xq, wq = x_meta.quantize(x), w_meta.quantize(w)  # scale from earlier steps
        delayed = (xq.data * xq.scale_inv) @ (wq.data * wq.scale_inv).T
        x_meta.update()  # this step's amax enters the history; next step's scale is set
        w_meta.update()
        clipped = int(np.sum(np.abs(x) * xq.scale > E4M3_MAX))  # beyond the format: clipped

        xc, wc = quantize_current_scaling(x, "e4m3"), quantize_current_scaling(w, "e4m3")
        current = (xc.data * xc.scale_inv) @ (wc.data * wc.scale_inv).T
        errors.append((clipped, relative_error(delayed, exact), relative_error(current, exact)))
        print(
            f"{step:4d}  {np.abs(x).max():10.3g}   {xq.scale:14.4g}  {clipped:7d}  "
            f"{errors[-1][1]:7.4f}   {xc.scale:14.4g}  {errors[-1][2]:7.4f}"
        )
    assert all(e[2] < 0.05 for e in errors), "current scaling should stay within E4M3 precision"
    lagging = [e for e in errors[1:] if e[0] > 0]
    assert lagging, "a growing input should push values past the delayed scale"
    assert all(e[1] > e[2] for e in lagging), "clipping should cost delayed scaling accuracy"


if __name__ == "__main__":
    main()
