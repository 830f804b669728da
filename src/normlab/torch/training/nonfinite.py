"""Non-finite operands: each converted layer counts the operands that held an inf or NaN.

Contract: every [QuantLinear][normlab.torch.training.linear.QuantLinear] (and
[QuantConv1D][normlab.torch.training.conv1d.QuantConv1D]) holds `nonfinite_operands`, a 0-d int64
tensor on its weight's device: the number of operands (x and W in each quantised forward,
dy in each backward; a forward recomputed by activation checkpointing counts nothing) whose
amax was inf or NaN since the current step began. The per-tensor recipes count from the
amax their scale step computes anyway; the others take one amax pass per operand. It is reset
to 0 where a step begins, at the first training forward of the step (the point where the
delayed scales update: every training forward by default, the first one inside a
[training_step][normlab.torch.training.steps.training_step] region), for every recipe. Counting
stays on the device (no host synchronisation); reading it (`int(...)`,
[nonfinite_layers][normlab.torch.training.nonfinite.nonfinite_layers]) synchronises.

Why a count: a recipe with a per-tensor or per-block scale turns an inf activation into a
finite output (FP8 current and delayed scaling, NVFP4, blockwise FP8: the scale falls back
to 1 or the block's scale is computed from an inf amax, and the saturating cast clips the
value to the format's largest), as Transformer Engine does, so a loss can stay finite while
an activation overflowed. The count lets skip-step logic see it (see `docs/torch.md`,
"Non-finite inputs", for what each recipe returns).
"""

from __future__ import annotations

import torch

from normlab.torch.training import _operand_ops as opaque

__all__ = ["count_nonfinite", "count_nonfinite_amax", "nonfinite_layers"]


def count_nonfinite_amax(counter: torch.Tensor, amax: torch.Tensor) -> None:
    """Add 1 to `counter` (0-d int64, in place) if the 0-d `amax` is inf or NaN."""
    counter.add_((~torch.isfinite(amax)).to(counter.device, torch.int64))


def count_nonfinite(counter: torch.Tensor, t: torch.Tensor) -> None:
    """Add 1 to `counter` (0-d int64, in place) if `t` holds an inf or NaN."""
    if t.numel() == 0:
        return
    # NaN if t holds one, inf if it holds an inf
    count_nonfinite_amax(counter, opaque.tensor_amax(t.detach()))


def nonfinite_layers(model: torch.nn.Module) -> dict[str, int]:
    """The converted layers of `model` that saw a non-finite operand in the current step.

    Parameters
    ----------
    model : torch.nn.Module
        The model (any module holding converted layers; wrappers such as
        `DistributedDataParallel` work too).

    Returns
    -------
    dict of str to int
        Qualified layer name -> its `nonfinite_operands` count, for the layers whose count
        is above 0 (empty when every operand was finite). Reads the counters (a host
        synchronisation on a GPU).

    Raises
    ------
    TypeError
        If `model` is not a `torch.nn.Module`.

    Examples
    --------
    >>> import torch
    >>> from normlab.torch import Fp8CurrentRecipe, convert
    >>> model = convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), Fp8CurrentRecipe())
    >>> x = torch.tensor([[1.0, float("inf"), 0.0, 2.0]])
    >>> bool(torch.isfinite(model(x)).all()), nonfinite_layers(model)
    (True, {'0': 1})
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    out = {}
    for name, m in model.named_modules():
        counter = getattr(m, "nonfinite_operands", None)
        if isinstance(counter, torch.Tensor) and int(counter) > 0:
            out[name] = int(counter)
    return out
