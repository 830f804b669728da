"""Is this forward a recomputation? Activation checkpointing seen from inside a layer.

Contract: [recomputing][normlab.torch.training.recompute.recomputing] is True exactly when a
forward runs while the autograd engine executes a backward pass. That is how every
activation-checkpointing implementation recomputes: `torch.utils.checkpoint` (the
non-reentrant form unpacks its saved tensors by re-running the function inside backward;
the reentrant form re-runs it in its own `backward`), and Hugging Face's
`gradient_checkpointing_enable` / `activation_checkpointing_enable`, which call it.
Converted layers use it to make a recomputed forward invisible to the recipe state: no
scale update, no amax recorded (Transformer Engine reaches the same end by stashing its
FP8 metadata in `checkpoint` and restoring it during the recompute).

Why the autograd engine's graph task and not a saved-tensor-hook context: it needs no
cooperation from the checkpoint function (plain `torch.utils.checkpoint`, reentrant or
not, third-party wrappers), and it is one call into the engine. While `torch.compile`
traces, the answer is False: a traced forward is an original forward (inside compiled
code the recomputation of a checkpointed region is the compiler's, from the saved graph,
and never re-runs the layer's Python).
"""

from __future__ import annotations

import torch

__all__ = ["recomputing"]


def recomputing() -> bool:
    """Whether the current forward is a recomputation during a backward pass.

    Returns
    -------
    recomputing : bool
        True while the autograd engine executes a backward pass (the current graph task
        id is not -1) and no `torch.compile` trace is under way; False otherwise.

    Examples
    --------
    >>> recomputing()
    False
    """
    if torch.compiler.is_compiling():
        return False
    return bool(torch._C._current_graph_task_id() != -1)
