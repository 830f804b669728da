"""The step boundary of delayed scaling: one scale update per optimizer step.

Contract: the delayed scales of a converted layer (`Fp8DelayedRecipe`) update once per
*step*, at the first training forward of the next step: the amaxes recorded during the step
are MAX-reduced over the process group, the scales computed and the history rolled, once.

- By default a step is one training forward and its backward. This is Transformer
  Engine's rule with one `autocast` (formerly `fp8_autocast`) region per forward, as its
  examples and Megatron-LM open one per micro-batch: the plain training loop (one forward
  per optimizer step) updates once per optimizer step.
- `with training_step(model):` around the micro-batches of gradient accumulation (or any
  step with several forwards: a layer called twice, a pipeline schedule) makes the whole
  body one step: every forward and backward inside uses the scales of the previous step and
  records its amaxes into the same history slot (running max), and the next step updates
  once. The amaxes of k micro-batches of b rows are then those of one batch of k b rows,
  as the amax all-reduce makes those of data-parallel ranks.
- A forward recomputed during the backward (activation checkpointing) is never a step:
  it uses the scales of the forward it repeats and records nothing
  ([normlab.torch.training.recompute][]).

Evaluation composes with both: a layer in eval mode, or inside
[no_quantization][normlab.torch.training.switch.no_quantization], records and updates nothing, so an
evaluation inside or between steps leaves the state as training left it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from normlab.torch.training.linear import QuantLinear

__all__ = ["training_step"]


@contextlib.contextmanager
def training_step(model: torch.nn.Module) -> Iterator[None]:
    """Make the body one step of delayed scaling: the scales update once for all of it.

    Wrap the micro-batches of one optimizer step (gradient accumulation) in it. Inside,
    each converted layer of `model` updates its delayed scales at most once, at its first
    training forward (closing the previous step), and every later forward and backward in
    the body quantises with those scales and records its amaxes into the same history slot
    (running max). Without it, every training forward starts a new step (Transformer
    Engine's behaviour with one `autocast` region per micro-batch). Regions nest (the
    outermost counts); recipes without delayed scaling are unaffected.

    Parameters
    ----------
    model : torch.nn.Module
        The model (or any module holding the converted layers: a
        `DistributedDataParallel` or `torch.compile` wrapper works too).

    Raises
    ------
    TypeError
        If `model` is not a `torch.nn.Module`.

    Examples
    --------
    >>> import torch
    >>> from normlab.torch import Fp8DelayedRecipe, convert, training_step
    >>> model = convert(torch.nn.Sequential(torch.nn.Linear(8, 8)), Fp8DelayedRecipe())
    >>> with training_step(model):
    ...     for micro_batch in torch.randn(4, 2, 8):
    ...         model(micro_batch).square().mean().backward()
    >>> history = model[0].amax_history  # (3, L): rows x, W, dy
    >>> int((history[:, 0] > 0).sum()), int((history[:, 1:] > 0).sum())  # slot 0 only: no roll
    (3, 0)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.enter_step()
    try:
        yield
    finally:
        for layer in layers:
            layer.exit_step()
