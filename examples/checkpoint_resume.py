"""Checkpoint a mixed-precision training run and resume it bit-identically.

The run: a small MLP with dropout, bf16 working weights with float32 masters, AdamW on
the masters and a dynamic loss scaler (PyTorch's GradScaler rules). It trains 12 steps
without stopping, then again with a checkpoint after step 6 written to disk, every object
rebuilt from scratch (other seeds) and loaded in PyTorch's order. The two runs must agree
bit for bit, step for step.

Run: `python examples/checkpoint_resume.py` (prints one line per step and "identical").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from normlab import checkpoint, nn
from normlab.nn.optim import AdamW
from normlab.precision import DynamicLossScaler, MasterWeights, mixed_precision_step

STEPS, SAVE_AFTER = 12, 6


def build(seed: int) -> dict:
    """Model, masters, optimizer, scaler: PyTorch's order (the optimizer needs the masters)."""
    init_rng, drop_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    model = nn.Sequential(nn.Linear(16, 32, rng=init_rng), nn.LayerNorm(32), nn.GELU(),
                          nn.Dropout(0.1, drop_rng), nn.Linear(32, 4, rng=init_rng))
    master = MasterWeights(model.parameters(), "bf16")
    return {"model": model, "master": master, "drop_rng": drop_rng,
            "optimizer": AdamW(master.masters, lr=3e-3),
            "scaler": DynamicLossScaler(init_scale=2.0**12, growth_interval=4)}


def train_step(run: dict, step: int) -> float:
    data = np.random.default_rng(10_000 + step)  # the batch of this step
    x = data.standard_normal((8, 16)).astype(np.float32)  # N,D
    y = data.integers(0, 4, size=8)
    run["model"].zero_grad()
    loss, dlogits = nn.softmax_cross_entropy(run["model"](x), y)
    run["model"].backward(run["scaler"].scale_loss(dlogits))  # backward of the scaled loss
    mixed_precision_step(run["master"], run["optimizer"], run["scaler"], max_norm=1.0)
    return loss


def state_of(run: dict) -> dict:
    return {"model": run["model"].state_dict(), "master": run["master"].state_dict(),
            "optimizer": run["optimizer"].state_dict(), "scaler": run["scaler"].state_dict(),
            "rng": run["drop_rng"].bit_generator.state, "step": SAVE_AFTER}


def restore(run: dict, state: dict) -> int:
    run["model"].load_state_dict(state["model"])
    run["master"].load_state_dict(state["master"])
    run["optimizer"].load_state_dict(state["optimizer"])
    run["scaler"].load_state_dict(state["scaler"])
    run["drop_rng"].bit_generator.state = state["rng"]
    return state["step"]


def main() -> None:
    straight = build(0)
    losses = [train_step(straight, t) for t in range(STEPS)]

    first = build(0)
    for t in range(SAVE_AFTER):
        train_step(first, t)
    with tempfile.TemporaryDirectory() as folder:
        path = checkpoint.save(Path(folder) / "step6", state_of(first))  # -> step6.npz
        del first  # the process "dies" here
        resumed = build(12345)  # fresh objects, different initial values
        start = restore(resumed, checkpoint.load(path))
    resumed_losses = [train_step(resumed, t) for t in range(start, STEPS)]

    for t, loss in enumerate(losses):
        again = resumed_losses[t - start] if t >= start else None
        print(f"step {t:2d}  loss {loss:.6f}" + ("" if again is None else f"  resumed {again:.6f}"))
    assert resumed_losses == losses[start:]
    for a, b in zip(straight["model"].parameters(), resumed["model"].parameters(), strict=True):
        assert a.data.tobytes() == b.data.tobytes()
    for a, b in zip(straight["master"].masters, resumed["master"].masters, strict=True):
        assert a.data.tobytes() == b.data.tobytes()
    print("identical: the resumed run matches the uninterrupted one bit for bit")


if __name__ == "__main__":
    main()
