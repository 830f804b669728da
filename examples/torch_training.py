"""normlab in a PyTorch training loop: convert a model, train with a recipe, then DDP and FSDP2.

Run: python examples/torch_training.py  (CPU is enough; measured: 25 s of CPU time, 51-62 s
wall on 2 CPU cores shared with other jobs at a load average of 5 to 8)
"""

import gc
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

from normlab.torch import (
    AdamW,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    NVFP4Recipe,
    QuantLinear,
    convert,
)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 64), torch.nn.GELU(),
        torch.nn.Linear(64, 1),
    )


def data(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 32, generator=g)
    return x, torch.sin(x[:, :4].sum(dim=1, keepdim=True))  # a smooth target


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
          y: torch.Tensor, steps: int = 40) -> float:
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return float(loss.detach())


def one_process() -> None:
    x, y = data()
    # 1. FP8 with Transformer Engine's delayed scaling; the output layer stays high precision
    model = convert(make_model(), Fp8DelayedRecipe(amax_history_len=16),
                    module_filter_fn=lambda module, fqn: fqn != "4")
    loss = train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), x, y)
    print(f"fp8 delayed scaling: loss {loss:.4f}, scales of layer 0 {model[0].scale.tolist()}")

    # 2. NVFP4 GEMMs and bf16 weights without fp32 masters, updated by stochastic rounding
    model = convert(make_model().to(torch.bfloat16), NVFP4Recipe())
    opt = AdamW(model.parameters(), lr=3e-3, param_rounding="stochastic", seed=0)
    print(f"nvfp4 + bf16 weights (stochastic rounding): loss {train(model, opt, x, y):.4f}")


def same_scales(model: torch.nn.Module, world: int) -> bool:
    scales = torch.stack([model[0].scale, model[2].scale])
    gathered = [torch.empty_like(scales) for _ in range(world)]
    dist.all_gather(gathered, scales)
    return all(torch.equal(gathered[0], s) for s in gathered)


def distributed_worker(rank: int, world: int, rendezvous: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)
    x, y = data()
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    # 3. DDP: each rank trains on its shard; amaxes are MAX-reduced over the ranks
    model = convert(make_model(), Fp8CurrentRecipe())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss = train(ddp, torch.optim.AdamW(ddp.parameters(), lr=3e-3), x[shard], y[shard], 20)
    same = same_scales(model, world)
    if rank == 0:
        print(f"DDP over {world} ranks: loss {loss:.4f}, every rank used the same scales: {same}")
    # 4. FSDP2: convert first, then shard each converted layer and the root
    model = convert(make_model(), Fp8CurrentRecipe())
    for layer in model:
        if isinstance(layer, QuantLinear):
            fully_shard(layer)
    fully_shard(model)
    loss = train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), x[shard], y[shard], 20)
    same = same_scales(model, world)
    if rank == 0:
        print(f"FSDP2 over {world} ranks: loss {loss:.4f}, "
              f"every rank used the same scales: {same}")
    del ddp, model  # free the models before tearing the process group down
    gc.collect()
    dist.destroy_process_group()


def main() -> int:
    one_process()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(distributed_worker, args=(2, os.path.join(tmp, "rendezvous")), nprocs=2,
                 join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
