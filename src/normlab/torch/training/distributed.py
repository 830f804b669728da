"""Amax reduction over `torch.distributed`: every rank derives its scales from the same amax.

Contract: [reduce_amax][normlab.torch.training.distributed.reduce_amax] all-reduces a float32 tensor
of amaxes in place with MAX over a process group and returns it. `group=None` means the
default group: the world group when `torch.distributed` is initialised (Transformer Engine's
`amax_reduction_group` default), else no reduction (one process). With a reduction, a
data-parallel run quantises each rank's shard with the scale a one-process run would compute
on the whole batch. Converted layers call it only in training forwards and their backward
([normlab.torch.training.training_mode][]), where every data-parallel rank calls it too.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["default_group", "reduce_amax"]


def default_group() -> Any | None:
    """The world group when `torch.distributed` is available and initialised, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def reduce_amax(amax: torch.Tensor, group: Any | None = None) -> torch.Tensor:
    """All-reduce `amax` in place with MAX over `group`.

    Parameters
    ----------
    amax : torch.Tensor
        Float tensor (any shape) of per-tensor amaxes, on the group's device.
    group : torch.distributed.ProcessGroup or None, optional
        A `torch.distributed` process group; None (the default) takes
        [default_group][normlab.torch.training.distributed.default_group].

    Returns
    -------
    amax : torch.Tensor
        The same tensor, now holding the elementwise maximum over the group's ranks
        (unchanged in a single process).

    Raises
    ------
    TypeError
        If `amax` is not a floating-point tensor.

    Examples
    --------
    >>> reduce_amax(torch.tensor([1.5, 2.0])).tolist()  # no process group: unchanged
    [1.5, 2.0]
    """
    if not isinstance(amax, torch.Tensor) or not amax.is_floating_point():
        raise TypeError(f"amax must be a floating-point torch.Tensor; got {amax!r}")
    grp = group if group is not None else default_group()
    if grp is None:
        return amax
    if torch.distributed.get_world_size(grp) > 1:
        torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=grp)
    return amax
