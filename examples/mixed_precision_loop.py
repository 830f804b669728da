"""A mixed-precision training loop: bf16 working weights, float32 masters, AdamW, dynamic
loss scaling.

The model (a two-layer MLP with LayerNorm) computes with weights rounded to bfloat16; the
float32 masters and AdamW's state live in `MasterWeights` and receive every small update;
`DynamicLossScaler` scales the loss (as GradScaler does) and `mixed_precision_step`
unscales, skips a step on overflow, clips, steps and refreshes the bf16 copy.

Run: `python examples/mixed_precision_loop.py`; prints the loss every 50 steps and
checks that the run learned (final loss well below the first).
"""

from __future__ import annotations

import numpy as np

from normlab.nn import GELU, LayerNorm, Linear, Sequential, softmax_cross_entropy
from normlab.nn.optim import AdamW
from normlab.precision import DynamicLossScaler, MasterWeights, mixed_precision_step

STEPS, BATCH, D_IN, HIDDEN, CLASSES = 200, 64, 16, 64, 4


def make_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A classification task a small MLP can learn: the class is the argmax of x @ W."""
    w_true = rng.standard_normal((D_IN, CLASSES))
    x = rng.standard_normal((2048, D_IN)).astype(np.float32)  # N, D_IN
    return x, np.argmax(x @ w_true, axis=1)  # N


def main() -> float:
    rng = np.random.default_rng(0)
    x_all, y_all = make_data(rng)
    model = Sequential(
        Linear(D_IN, HIDDEN, rng=rng), LayerNorm(HIDDEN), GELU(), Linear(HIDDEN, CLASSES, rng=rng)
    )
    params = list(model.parameters())
    master = MasterWeights(params, "bf16")  # model weights now hold bf16 values
    optimizer = AdamW(master.masters, lr=3e-3, weight_decay=0.01)  # on the float32 masters
    scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=100)

    losses = []
    for step in range(STEPS):
        idx = rng.integers(0, len(x_all), BATCH)
        model.zero_grad()
        logits = model(x_all[idx])  # B, CLASSES
        loss, dlogits = softmax_cross_entropy(logits, y_all[idx])
        # backward of the scaled loss: every gradient comes out multiplied by the scale
        model.backward(dlogits * np.float32(scaler.get_scale()))
        result = mixed_precision_step(master, optimizer, scaler, max_norm=1.0)
        losses.append(loss)
        if step % 50 == 0 or step == STEPS - 1:
            print(
                f"step {step:3d}  loss {loss:.4f}  scale 2^{int(np.log2(result.scale))}"
                f"  {'skipped' if result.skipped else ''}"
            )
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    print(f"mean loss: first 10 steps {first:.3f}, last 10 steps {last:.3f}")
    assert last < 0.5 * first, "the mixed-precision run did not learn"
    # the working weights hold bf16 values: rounding them to bf16 changes nothing
    from normlab.precision import quantize

    assert all(np.array_equal(p.data, quantize(p.data, "bf16")) for p in params)
    return last


if __name__ == "__main__":
    main()
