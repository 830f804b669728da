r"""The emulated-training benchmark's model, its training step and the recipes it runs.

Needs PyTorch (imported at the top: [normlab.bench.command][] imports this module only when
PyTorch is installed). The model is a stack of pre-norm residual MLP blocks,
$x \leftarrow x + W_2\,\mathrm{GELU}(W_1\,\mathrm{LayerNorm}(x) + b_1) + b_2$, on a batch
of `tokens` rows of width `width`, hidden size `hidden`; a step is zero-grad, forward,
mean-squared error against a fixed target, backward and one `torch.optim.AdamW` update.
The converted model is a deep copy passed through `normlab.torch.training.convert` (every Linear
becomes a `QuantLinear`), or through torchao's `convert_to_float8_training` with
`Float8LinearConfig(emulate=True)` (its float8 emulation: float8 casts, float32 matmuls),
the outside reference point.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint

import normlab.torch as nt

__all__ = ["FULL", "QUICK", "MLPBlock", "ModelSize", "Run", "build_model", "checkpointed",
           "convert", "recipes", "torchao_convert"]


@dataclass(frozen=True)
class ModelSize:
    """The benchmark model's sizes.

    Attributes
    ----------
    tokens : int
        Rows of the batch (M of every GEMM).
    width : int
        Model width (the residual stream).
    hidden : int
        Hidden size of each MLP.
    blocks : int
        Residual MLP blocks.
    """

    tokens: int
    width: int
    hidden: int
    blocks: int = 2


FULL = ModelSize(tokens=2048, width=512, hidden=1536)
"""The issue's model: 2 blocks, tokens 2048, width 512, hidden 1536."""
QUICK = ModelSize(tokens=128, width=64, hidden=192)
"""A smoke-run model for `--quick` (every code path, milliseconds per step)."""


class MLPBlock(torch.nn.Module):
    """One pre-norm residual MLP block: `x + fc2(gelu(fc1(norm(x))))`.

    With `recompute` set, `gelu(fc1(norm(x)))` runs under `torch.utils.checkpoint`
    (non-reentrant): the forward keeps only the block's input for it and backward runs
    that part again (activation checkpointing, as Transformer Engine's `LayerNormMLP`
    `checkpoint` option does for its whole MLP).

    Parameters
    ----------
    width : int
        Input and output width.
    hidden : int
        Hidden width.

    Attributes
    ----------
    norm : torch.nn.LayerNorm
        The LayerNorm over `width` features, applied first.
    fc1 : torch.nn.Linear
        `width` to `hidden` features.
    fc2 : torch.nn.Linear
        `hidden` back to `width` features.
    recompute : bool
        Checkpoint norm, fc1 and GELU (default False).
    """

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)
        self.recompute = False

    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc1(self.norm(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block on `x`, shape (M, width)."""
        if self.recompute and torch.is_grad_enabled():
            h = torch.utils.checkpoint.checkpoint(self._hidden, x, use_reentrant=False)
        else:
            h = self._hidden(x)
        return x + self.fc2(h)


def build_model(size: ModelSize, dtype: torch.dtype, seed: int = 0) -> torch.nn.Sequential:
    """The benchmark model with weights drawn from `seed`, in `dtype`.

    Parameters
    ----------
    size : ModelSize
        The sizes.
    dtype : torch.dtype
        Parameter dtype (float32 or bfloat16).
    seed : int, optional
        Seed of the initialisation. Default 0.

    Returns
    -------
    model : torch.nn.Sequential
        `size.blocks` MLP blocks.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = [MLPBlock(size.width, size.hidden) for _ in range(size.blocks)]
    return torch.nn.Sequential(*blocks).to(dtype)


@dataclass
class Run:
    """A model with its data and optimizer: one call of `step` is one training step.

    Attributes
    ----------
    model : torch.nn.Module
        The model (converted or not).
    x : torch.Tensor
        The input batch, shape (tokens, width), the model's dtype.
    target : torch.Tensor
        The float32 regression target, shape (tokens, width).
    optimizer : torch.optim.Optimizer
        AdamW over the model's parameters.
    """

    model: torch.nn.Module
    x: torch.Tensor
    target: torch.Tensor
    optimizer: torch.optim.Optimizer

    @classmethod
    def of(cls, model: torch.nn.Module, size: ModelSize, seed: int = 1) -> Run:
        """A run of `model` on data drawn from `seed` (the same for every model)."""
        dtype = next(model.parameters()).dtype
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(size.tokens, size.width, generator=g).to(dtype)
        target = torch.randn(size.tokens, size.width, generator=g)
        return cls(model, x, target, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def loss(self) -> torch.Tensor:
        """Forward and the mean-squared error (float32)."""
        return torch.nn.functional.mse_loss(self.model(self.x).float(), self.target)

    def step(self) -> float:
        """Zero the gradients, forward, backward, one AdamW update; returns the loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def recipes() -> dict[str, Any]:
    """The recipes of the benchmark, by the name its table shows, with default settings.

    Returns
    -------
    recipes : dict
        Name -> a `normlab.torch` training recipe.
    """
    return {"Bf16": nt.Bf16Recipe(), "FP8 delayed": nt.Fp8DelayedRecipe(),
            "FP8 current": nt.Fp8CurrentRecipe(), "FP8 rowwise": nt.Fp8RowwiseRecipe(),
            "FP8 rowwise, wgrad high": nt.Fp8RowwiseRecipe(grad_weight_high_precision=True),
            "Blockwise FP8": nt.BlockwiseFp8Recipe(),
            "MX": nt.MXRecipe(), "NVFP4": nt.NVFP4Recipe()}


def convert(model: torch.nn.Module, recipe: Any) -> torch.nn.Module:
    """A deep copy of `model` with every Linear a `QuantLinear(recipe)`.

    Parameters
    ----------
    model : torch.nn.Module
        The unconverted model (left as it is).
    recipe : object
        A `normlab.torch` training recipe.

    Returns
    -------
    converted : torch.nn.Module
        The converted copy.
    """
    return nt.convert(copy.deepcopy(model), recipe)


def checkpointed(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every `MLPBlock` checkpointing norm, fc1 and GELU (in place).

    Parameters
    ----------
    model : torch.nn.Module
        A benchmark model, converted or not.

    Returns
    -------
    model : torch.nn.Module
        The same model.
    """
    for m in model.modules():
        if isinstance(m, MLPBlock):
            m.recompute = True
    return model


def torchao_convert() -> Callable[[torch.nn.Module], torch.nn.Module] | str:
    """torchao's float8 emulation as a converter, or why it is not there.

    Returns
    -------
    converter : callable or str
        `model -> converted deep copy` (tensorwise dynamic scaling, E4M3 forward, E5M2
        gradients, emulated matmuls), or a message ("not installed", or the import error).
    """
    try:
        ao = importlib.import_module("torchao.float8")
    except ModuleNotFoundError:
        return "not installed"
    except Exception as exc:  # a broken install: say what failed, bench the rest
        return f"import failed ({type(exc).__name__}: {exc})"
    config = ao.Float8LinearConfig(emulate=True)

    def converter(model: torch.nn.Module) -> torch.nn.Module:
        out: torch.nn.Module = ao.convert_to_float8_training(copy.deepcopy(model),
                                                             config=config)
        return out

    return converter
