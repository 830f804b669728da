"""`InspectLog`: the inspector's records, one step at a time, reduced over ranks, as JSON lines.

Contract: the hooks hand each recorded operand's raw statistics
([raw_stats][normlab.torch.numerics._stats.raw_stats], tensors on the operand's device) to
`add`; nothing reaches the host until [step][normlab.torch.InspectLog.step], which
finishes the step's records in one transfer, appends them to `records` and writes them to
the JSON-lines file (flushed, so an interrupted run keeps every finished step).

Distributed: under an initialised `torch.distributed` with more than one rank, `step`
reduces the statistics over the ranks first (counts and powers summed, amax and the other
maxima by MAX, minima by MAX of their negation), so every rank's `records` hold the
statistics of the whole global batch, and only rank 0 writes the file. Every rank must
record the same operands (the same modules, recipes and steps, as data parallelism gives);
a rank that records a different number of them raises RuntimeError at `step`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TextIO

import torch

from normlab.torch.numerics._stats import finish
from normlab.torch.training.distributed import default_group

__all__ = ["InspectLog"]


class InspectLog:
    """The records of an [inspect][normlab.torch.inspect] run, as it yields them.

    Call [step][normlab.torch.InspectLog.step] once per optimizer step, after the
    backward pass; the operands of recorded steps (every `every`-th, counting from step 0)
    become one record per (module, tensor, recipe).

    Attributes
    ----------
    records : list of dict
        The finished records, in order: `step`, `module`, `tensor`, `recipe`, `format`,
        `ranks` and the statistics that [inspect][normlab.torch.inspect] lists.
    every : int
        Records every `every`-th step.
    path : str or None
        The JSON-lines file (None: records are kept in memory only).
    on_step : callable or None
        Called as `on_step(recording)` at the end of each `step()`, with whether the new
        step is recorded ([inspect][normlab.torch.inspect] installs or removes its hooks
        there); None: nothing.
    """

    def __init__(self, *, every: int, path: str | os.PathLike[str] | None) -> None:
        self.records: list[dict[str, Any]] = []
        self.every = every
        self.path = None if path is None else os.fspath(path)
        self.on_step: Callable[[bool], None] | None = None
        self._step = 0
        self._pending: dict[tuple[str, str, str], tuple[str, torch.Tensor, torch.Tensor]] = {}
        self._end_steps: list[Any] = []
        self._file: TextIO | None = None
        group = default_group()
        self._group = group if group is not None and torch.distributed.get_world_size(
            group) > 1 else None
        self._writes = self._group is None or torch.distributed.get_rank() == 0
        if self.path is not None and self._writes:
            self._file = open(self.path, "w", encoding="utf-8")  # closed by close()

    @property
    def current_step(self) -> int:
        """The number of the step in progress (0 before the first `step()` call)."""
        return self._step

    @property
    def recording(self) -> bool:
        """Whether the step in progress is recorded."""
        return self._step % self.every == 0

    def wants(self, module: str, tensor: str, recipe: str) -> bool:
        """True while the step is recorded and this operand has no statistics in it yet
        (the first call of a module in a step is the one recorded)."""
        return self.recording and (module, tensor, recipe) not in self._pending

    def add(self, module: str, tensor: str, recipe: str, fmt: str,
            stats: tuple[torch.Tensor, torch.Tensor], end_step: Any = None) -> None:
        """Keep one operand's raw statistics until the end of the step."""
        self._pending[(module, tensor, recipe)] = (fmt, *stats)
        if end_step is not None and end_step not in self._end_steps:
            self._end_steps.append(end_step)

    def step(self) -> None:
        """End the optimizer step: finish, reduce and write its records, then count it."""
        self._flush()
        self._step += 1
        if self.on_step is not None:
            self.on_step(self.recording)

    def _flush(self) -> None:
        keys = sorted(self._pending)  # the same order on every rank
        if self._group is not None and self.recording:
            self._check_same_count(len(keys))
        if not keys:
            return
        dev = self._device(self._pending[keys[0]][1].device)
        sums = torch.stack([self._pending[k][1].to(dev) for k in keys])  # n,S
        maxima = torch.stack([self._pending[k][2].to(dev) for k in keys])  # n,X
        if self._group is not None:
            dist = torch.distributed
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self._group)
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=self._group)
        ranks = 1 if self._group is None else torch.distributed.get_world_size(self._group)
        new = []
        for (module, tensor, recipe), s, m in zip(keys, sums.tolist(), maxima.tolist(),
                                                  strict=True):
            new.append({"step": self._step, "module": module, "tensor": tensor,
                        "recipe": recipe, "format": self._pending[(module, tensor, recipe)][0],
                        "ranks": ranks, **finish(s, m)})
        self._pending.clear()
        for end_step in self._end_steps:
            end_step()
        self._end_steps.clear()
        self.records.extend(new)
        if self._file is not None:
            for rec in new:
                self._file.write(json.dumps(rec) + "\n")
            self._file.flush()

    def _device(self, first: torch.device) -> torch.device:
        """Where the step's statistics are joined: the first operand's device, or the one
        the process group's backend reduces on."""
        if self._group is None:
            return first
        nccl = torch.distributed.get_backend(self._group) == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def _check_same_count(self, n: int) -> None:
        dist = torch.distributed
        both = torch.tensor([n, -n], dtype=torch.int64, device=self._device(torch.device("cpu")))
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self._group)
        if int(both[0]) != n or int(-both[1]) != n:
            raise RuntimeError(f"inspect: ranks recorded different numbers of operands at step "
                               f"{self._step} (this rank {n}, between {int(-both[1])} and "
                               f"{int(both[0])}); every rank must run the same modules")

    def close(self) -> None:
        """Finish a step left open (operands recorded but no `step()` call), close the file."""
        try:
            if self._pending:
                self._flush()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None
