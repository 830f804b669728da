"""When a converted layer's forward is a *training forward*: the one rule for amax
recording, scale updates and amax all-reduces.

Contract: a forward of a [QuantLinear][normlab.torch.QuantLinear] is a training forward
when the layer is in training mode (`module.training`). Only a training forward (and the
backward of its graph, while the layer is still in training mode) records amaxes into the
delayed-scaling history, closes the previous step (reduce, update, roll) and all-reduces
amaxes over the process group (`reduce_amax`); an empty batch takes part like any other
(its amax is 0). A forward in `eval()` mode, or inside
[no_quantization][normlab.torch.training.switch.no_quantization], enters no collective and changes
no recipe state (current scaling then scales by the rank's own amax). So a rank that
evaluates alone in `eval()` mode, or skips quantisation, never leaves the other ranks
waiting in an all-reduce, and data-parallel ranks, which run the same training forwards
and backwards, enter the same collectives in the same order.

Transformer Engine 2.x decides by autograd: every forward in an `autocast` region
registers its amaxes, and the forward amaxes are reduced and the scales updated when the
outermost region exits with `torch.is_grad_enabled()`; `module.training` matters there
only for activation recomputation. normlab decides by `module.training`, for two reasons:
an evaluation in `eval()` mode never enters a collective, with autograd on or off; and
reentrant activation checkpointing (`torch.utils.checkpoint(..., use_reentrant=True)`,
Hugging Face's default) runs the original forward under `torch.no_grad()`, which must
still record and update (Transformer Engine needs its own `checkpoint` for that). The
consequences: evaluate in `eval()` mode (a forward in training mode under
`torch.no_grad()` is a training forward, and on a subset of ranks would wait for the
others), and train in training mode: a model trained in `eval()` mode (Hugging Face
`from_pretrained` returns one) keeps its delayed scales frozen and its amaxes unreduced,
so the first forward in `eval()` mode that records for a backward (autograd on, a
parameter or input requiring a gradient) warns once per process with
[EvalModeTrainingWarning][normlab.torch.training.training_mode.EvalModeTrainingWarning].
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["EvalModeTrainingWarning", "is_training_forward", "warn_eval_mode_training"]

_warned = False  # the eval-mode warning is given once per process


class EvalModeTrainingWarning(UserWarning):
    """A converted layer with recipe state records for a backward in `eval()` mode.

    Its delayed scales stay frozen and its amaxes are not all-reduced (see
    [normlab.torch.training.training_mode][]); call `model.train()` before training.
    """


def is_training_forward(module: torch.nn.Module) -> bool:
    """Whether a forward of `module` now is a training forward (the module header's rule).

    Parameters
    ----------
    module : torch.nn.Module
        A converted layer.

    Returns
    -------
    bool
        `module.training`.
    """
    return bool(module.training)


def warn_eval_mode_training(module: torch.nn.Module, *tensors: Any) -> None:
    """Warn once per process when `module` (in `eval()` mode, with recipe state) runs a
    forward that records for a backward: autograd on and one of `tensors` requires a
    gradient."""
    global _warned
    if _warned or module.training or not torch.is_grad_enabled():
        return
    if not any(t is not None and t.requires_grad for t in tensors):
        return
    _warned = True
    warnings.warn(f"{type(module).__name__} runs a forward for a backward pass in eval() "
                  "mode: its delayed scales do not update and its amaxes are not reduced "
                  "over the process group; call model.train() before training",
                  EvalModeTrainingWarning, stacklevel=3)
