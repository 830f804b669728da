"""The benchmark's memory measures: peak extra bytes of a NumPy call, saved-for-backward bytes.

- [peak_extra][normlab.bench.memory.peak_extra]: the peak of the bytes `tracemalloc` traces
  (NumPy registers its buffers with it) while a call runs, above what was allocated before
  it, outputs included.
- [saved_bytes][normlab.bench.memory.saved_bytes]: the bytes autograd keeps for backward
  during a PyTorch forward, counted through `torch.autograd.graph.saved_tensors_hooks`.
  Every tensor saved for backward passes the pack hook; tensors that share a storage
  (views, the same tensor saved twice) count once, with their storage's full size, and
  storages of the tensors in `exclude` (a model's parameters, which exist whether or not a
  backward follows) do not count. PyTorch is imported inside the function only: this
  module imports without it.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["peak_extra", "saved_bytes"]


def peak_extra(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated (NumPy buffers are traced) while `fn` runs, outputs included.

    Parameters
    ----------
    fn : callable
        The call to measure (no arguments); its result is dropped after the measurement.

    Returns
    -------
    nbytes : int
        Peak traced bytes above the level when `fn` started.

    Examples
    --------
    >>> import numpy as np
    >>> peak_extra(lambda: np.ones(1 << 20)) >= 8 << 20
    True
    """
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak


def saved_bytes(forward: Callable[[], Any], exclude: Iterable[Any] = (),
                within: Iterable[Any] | None = None) -> tuple[Any, int]:
    """Run a PyTorch `forward` and count the bytes it saves for backward.

    Parameters
    ----------
    forward : callable
        Runs the forward pass (no arguments) and returns what backward will need (the
        loss); the saved tensors stay alive with it.
    exclude : iterable of torch.Tensor, optional
        Tensors whose storages do not count (a model's parameters).
    within : iterable of torch.nn.Module, optional
        Count only what is saved while one of these modules' forward runs (a model's
        linear layers); None (the default) counts everything.

    Returns
    -------
    result : object
        What `forward` returned.
    nbytes : int
        Sum of the sizes of the distinct storages saved for backward, less the excluded.

    Examples
    --------
    >>> import torch
    >>> w = torch.ones(4, 4, requires_grad=True)
    >>> x = torch.ones(8, 4)
    >>> _, n = saved_bytes(lambda: (x @ w).relu().sum(), exclude=[w])
    >>> n  # x (8x4) for dW and relu's output (8x4), float32; w excluded
    256
    """
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}
    depth = [0 if within is None else -1]  # >= 0: inside (counted); -1: outside

    def enter(*_: Any) -> None:
        depth[0] += 1

    def leave(*_: Any) -> None:
        depth[0] -= 1

    handles = [h for m in (within or ()) for h in (m.register_forward_pre_hook(enter),
                                                  m.register_forward_hook(leave))]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if depth[0] >= 0 and storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = forward()
    finally:
        for h in handles:
            h.remove()
    return result, sum(storages.values())
