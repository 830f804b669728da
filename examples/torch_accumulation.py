"""Delayed scaling over a training step: gradient accumulation with `training_step`, and
activation checkpointing, which changes nothing.

Run: python examples/torch_accumulation.py  (CPU is enough; measured: 7 s of CPU time, 14 s wall
on 2 CPU cores shared with other jobs at a load average of 6 to 7)
"""

import sys

import torch
from torch.utils.checkpoint import checkpoint

from normlab.torch import Fp8DelayedRecipe, convert, training_step

RECIPE = Fp8DelayedRecipe(amax_history_len=32)
STEPS, MICRO = 5, 4  # optimizer steps, micro-batches per step


class Net(torch.nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)
        self.block = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                         torch.nn.Linear(128, 64))
        self.out = torch.nn.Linear(64, 1)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.inp(x))
        # recompute the block's activations in the backward instead of keeping them
        h = checkpoint(self.block, h, use_reentrant=False) if self.checkpointed else self.block(h)
        return self.out(h)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 32, generator=g)
    return x, torch.sin(x[:, :4].sum(dim=1, keepdim=True))


def train(*, micro: int, region: bool, checkpointed: bool = False) -> dict:
    torch.manual_seed(0)
    model = convert(Net(checkpointed), RECIPE, keep_lm_head=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        with training_step(model) if region else torch.enable_grad():
            for xs, ys in zip(x.chunk(micro), y.chunk(micro), strict=True):
                loss = torch.nn.functional.mse_loss(model(xs), ys) / micro
                loss.backward()
                losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
    layer = model.block[0]
    return {"model": model, "losses": losses, "rolls": int((layer.amax_history[0] != 0).sum())}


def main() -> int:
    # 1. four micro-batches per step: with training_step the history rolls once per step
    per_step = train(micro=MICRO, region=True)
    per_micro = train(micro=MICRO, region=False)
    print(f"{STEPS} steps of {MICRO} micro-batches: amax history slots filled "
          f"{per_step['rolls']} with training_step, {per_micro['rolls']} without")
    assert per_step["rolls"] == STEPS and per_micro["rolls"] == STEPS * MICRO

    # 2. activation checkpointing: everything bit for bit as without it
    ckpt = train(micro=MICRO, region=True, checkpointed=True)
    identical = all(torch.equal(a, b) for a, b in zip(per_step["losses"], ckpt["losses"],
                                                       strict=True))
    identical &= all(torch.equal(a, b) for a, b in
                     zip(per_step["model"].state_dict().values(),
                         ckpt["model"].state_dict().values(), strict=True))
    print(f"checkpointed block: losses, weights and scales bit-identical: {identical}")
    assert identical
    print(f"final loss {float(sum(ckpt['losses'][-MICRO:])):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
